package worker

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Reading JetStream: a consumer's messages one at a time (the pull loops and the
// session openers), a stream's messages in order (the rare paths), and a wait.

// pullEach fetches one message of cons at a time and hands it to handle, which runs
// it to its end before the next is asked for, until ctx ends. A failed fetch is
// logged (what names the message) and tried again a second later.
func pullEach(ctx context.Context, cons jetstream.Consumer, log *slog.Logger, what string, handle func(jetstream.Msg)) {
	for ctx.Err() == nil {
		batch, err := cons.Fetch(1, jetstream.FetchContext(ctx))
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("fetch "+what, "err", err)
				sleep(ctx, time.Second)
			}
			continue
		}
		for msg := range batch.Messages() {
			handle(msg)
		}
		if err := batch.Error(); err != nil && ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) {
			log.Debug("fetch ended", "err", err)
		}
	}
}

// scan calls f with each message of stream whose subject matches filter, in order,
// from stream sequence from (the first, for 0) to the last one stored when it starts,
// until f returns false; it reads at most limit of them and says whether it read
// them all. It gets them one at a time: a work queue takes no second consumer over
// subjects its consumers filter, and a message deleted meanwhile is skipped. Only
// rare paths use it (a cancel, a job no worker can take, a session's end).
func scan(ctx context.Context, stream jetstream.Stream, filter string, from uint64, limit int, f func(*jetstream.RawStreamMsg) bool) (complete bool, err error) {
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil || len(info.State.Subjects) == 0 {
		return err == nil, err
	}
	seq, last := max(info.State.FirstSeq, from), info.State.LastSeq
	for range limit {
		msg, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		if !f(msg) || msg.Sequence >= last {
			return true, nil
		}
		seq = msg.Sequence + 1
	}
	return false, nil
}

// sleep waits d, or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
}
