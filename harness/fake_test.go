package harness

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jazzmine/worker/wire"
)

// fakeHarness is a scripted peer for the executor's own rules: what it does with lines
// that are not its execution's, and its host-side limits. The real harness is tested
// in executor_test.go.
type fakeHarness struct {
	conn     *Conn
	out      *io.PipeWriter // what the fake "prints"
	requests chan map[string]any
}

func newFake(t *testing.T, maxLine int) *fakeHarness {
	t.Helper()
	outR, outW := io.Pipe()
	inR, inW := io.Pipe()
	f := &fakeHarness{out: outW, requests: make(chan map[string]any, 16)}
	f.conn = NewConn(outR, inW, maxLine)
	go func() {
		sc := bufio.NewScanner(inR)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				f.requests <- m
			}
		}
	}()
	t.Cleanup(func() {
		f.conn.Close()
		outW.Close()
		inR.Close()
		<-f.conn.Done()
	})
	return f
}

func (f *fakeHarness) say(lines ...string) {
	for _, l := range lines {
		io.WriteString(f.out, l+"\n")
	}
}

func TestExecutorTakesOnlyItsExecutionsLinesAndTheNoncedEnd(t *testing.T) {
	f := newFake(t, 0)
	go func() {
		req := <-f.requests
		f.say(
			`{"type":"intermediate","execution_id":"now","label":"l","data":[1]}`,
			`{"type":"final_result","execution_id":"now","data":{"ok":true}}`,
			`{"type":"script_done","execution_id":"now","exit_code":0,"nonce":"`+req["nonce"].(string)+`"}`,
		)
	}()
	rec := &recorder{}
	var e Executor
	res, err := e.Run(context.Background(), f.conn, Request{ExecutionID: "now", Script: "x"}, rec.on)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Success || string(res.FinalData) != `{"ok":true}` || !res.Reusable || res.Violation != "" {
		t.Errorf("result = %+v", res)
	}
	if got := rec.types(); !slices.Equal(got, []string{wire.EventIntermediate, wire.EventFinalResult, wire.EventScriptDone}) {
		t.Errorf("events = %v", got)
	}
}

// TestALineThatAnswersNothingEndsTheRunAndRetiresTheContainer: the harness is the only
// writer of its stream, so a line that is not its execution's, or an end without the
// execute's nonce, means something else writes there. The run is never a success,
// even with a result before it, and the container is not reused.
func TestALineThatAnswersNothingEndsTheRunAndRetiresTheContainer(t *testing.T) {
	for _, tc := range []struct{ name, line string }{
		{"another execution's result", `{"type":"final_result","execution_id":"old","data":"stale"}`},
		{"another execution's end", `{"type":"script_done","execution_id":"old","nonce":"NONCE"}`},
		{"a line that is not JSON", `this is not json`},
		{"a pong nobody asked for", `{"type":"pong","nonce":"NONCE"}`},
		{"a reset_done during the run", `{"type":"reset_done","nonce":"NONCE"}`},
		{"an end without the nonce", `{"type":"script_done","execution_id":"now"}`},
		{"an end with a guessed nonce", `{"type":"script_done","execution_id":"now","nonce":"00000000000000000000000000000000"}`},
		{"an event with no execution id", `{"type":"final_result","data":"forged"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, 0)
			go func() {
				req := <-f.requests
				nonce := req["nonce"].(string)
				f.say(
					`{"type":"final_result","execution_id":"now","data":"forged"}`,
					strings.ReplaceAll(tc.line, "NONCE", nonce),
					`{"type":"script_done","execution_id":"now","nonce":"`+nonce+`"}`,
				)
			}()
			rec := &recorder{}
			var e Executor
			res, err := e.Run(context.Background(), f.conn, Request{ExecutionID: "now", Script: "x"}, rec.on)
			if err != nil {
				t.Fatal(err)
			}
			if res.Success || res.ErrorKind != wire.KindCrashed || res.Reusable || !strings.Contains(res.Violation, "protocol violation") {
				t.Errorf("result: success=%v kind=%q reusable=%v violation=%q, want a crash, not reusable", res.Success, res.ErrorKind, res.Reusable, res.Violation)
			}
			if got := rec.types(); !slices.Equal(got, []string{wire.EventFinalResult, wire.EventError, wire.EventScriptDone}) {
				t.Errorf("events = %v, want the run to end at the line", got)
			}
		})
	}
}

func TestEveryAnswerMustCarryItsRequestsNonce(t *testing.T) {
	f := newFake(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go func() {
		req := <-f.requests
		f.say(`{"type":"pong","nonce":"` + req["nonce"].(string) + `"}`)
		<-f.requests
		f.say(`{"type":"pong","nonce":"` + req["nonce"].(string) + `"}`) // the first ping's, again
	}()
	if err := f.conn.Ping(ctx); err != nil {
		t.Fatalf("a pong with the ping's nonce: %v", err)
	}
	if err := f.conn.Ping(ctx); !errors.Is(err, ErrProtocol) {
		t.Errorf("a replayed pong: %v, want ErrProtocol", err)
	}
}

func TestExecutorTimesOutOnASilentHarness(t *testing.T) {
	f := newFake(t, 0)
	rec := &recorder{}
	e := Executor{Buffer: 50 * time.Millisecond}
	res, err := e.Run(context.Background(), f.conn, Request{ExecutionID: "quiet", Script: "x", Timeout: 50 * time.Millisecond}, rec.on)
	if err != nil {
		t.Fatal(err)
	}
	if res.Success || res.ErrorKind != wire.KindTimeout || res.Error != "Timed out waiting for container response" || res.Reusable {
		t.Errorf("result = %+v", res)
	}
	if got := rec.types(); !slices.Equal(got, []string{wire.EventError, wire.EventScriptDone}) {
		t.Errorf("events = %v", got)
	}
}

func TestExecutorEnforcesTheOutputLimitOnTheStream(t *testing.T) {
	f := newFake(t, 0)
	go func() {
		<-f.requests
		chunk := `{"type":"stdout","execution_id":"flood","text":"` + strings.Repeat("x", 1000) + `"}`
		for range 100 {
			f.say(chunk)
		}
	}()
	var e Executor
	res, err := e.Run(context.Background(), f.conn, Request{ExecutionID: "flood", Script: "x", MaxOutputBytes: 10_000}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.ErrorKind != wire.KindOutputLimit || res.Reusable || res.OutputBytes <= 10_000 || res.OutputBytes > 12_000 {
		t.Errorf("result: kind=%q reusable=%v output=%d, want output_limit just past 10000 bytes", res.ErrorKind, res.Reusable, res.OutputBytes)
	}
}

func TestExecutorDropsAnOversizedLine(t *testing.T) {
	f := newFake(t, 4096)
	go func() {
		<-f.requests
		f.say(`{"type":"final_result","execution_id":"big","data":"` + strings.Repeat("y", 100_000) + `"}`)
	}()
	var e Executor
	res, err := e.Run(context.Background(), f.conn, Request{ExecutionID: "big", Script: "x"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.ErrorKind != wire.KindOutputLimit || res.FinalData != nil {
		t.Errorf("result: kind=%q data=%d bytes, want output_limit and no data", res.ErrorKind, len(res.FinalData))
	}
}

func TestExecutorReportsAClosedStream(t *testing.T) {
	f := newFake(t, 0)
	go func() {
		<-f.requests
		f.say(`{"type":"stdout","execution_id":"eof","text":"partial"}`)
		f.out.Close()
	}()
	rec := &recorder{}
	var e Executor
	res, err := e.Run(context.Background(), f.conn, Request{ExecutionID: "eof", Script: "x"}, rec.on)
	if err != nil {
		t.Fatal(err)
	}
	if res.Error != ErrStdoutClosed || res.ErrorKind != wire.KindCrashed || res.Reusable {
		t.Errorf("result = %+v", res)
	}
	if got := rec.types(); !slices.Equal(got, []string{wire.EventStdout, wire.EventError, wire.EventScriptDone}) {
		t.Errorf("events = %v", got)
	}
	if _, err := (&Executor{}).Run(context.Background(), f.conn, Request{ExecutionID: "next", Script: "x"}, nil); err != nil {
		t.Errorf("a run on a closed stream should be a result, not an error: %v", err)
	}
}

func TestExecutorCancelsWithoutConfirmation(t *testing.T) {
	f := newFake(t, 0)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-f.requests // execute
		cancel()
		<-f.requests // cancel: the fake never confirms
	}()
	e := Executor{CancelGrace: 50 * time.Millisecond}
	res, err := e.Run(ctx, f.conn, Request{ExecutionID: "c", Script: "x"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.ErrorKind != wire.KindCancelled || res.Reusable {
		t.Errorf("result: kind=%q reusable=%v, want cancelled, not reusable", res.ErrorKind, res.Reusable)
	}
}

// TestAConnWithUnreadOutputIsNotQuiet: what the pool asks before it lends an idle
// container. A line nobody asked for since the last answer, or a closed stream, and
// the container is retired rather than lent.
func TestAConnWithUnreadOutputIsNotQuiet(t *testing.T) {
	f := newFake(t, 0)
	if !f.conn.Quiet() {
		t.Fatal("a fresh conn with nothing to read is not quiet")
	}
	f.say(`{"type":"pong","nonce":"unasked"}`)
	deadline := time.Now().Add(10 * time.Second)
	for f.conn.Quiet() && time.Now().Before(deadline) {
		runtime.Gosched()
	}
	if f.conn.Quiet() {
		t.Error("a conn with an unasked line waiting is quiet")
	}
	g := newFake(t, 0)
	g.out.Close()
	<-g.conn.Done()
	if g.conn.Quiet() {
		t.Error("a conn whose stream ended is quiet")
	}
}
