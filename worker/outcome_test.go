package worker

import (
	"testing"
	"time"
)

func TestDecideMapsEachOutcomeToOneAction(t *testing.T) {
	const delay = 2 * time.Second
	cases := []struct {
		name      string
		outcome   outcome
		last      bool
		want      action
		wantDelay time.Duration
	}{
		{"a script that ran is acked, whatever its result", outRan, false, actAck, 0},
		{"a script that ran on its last delivery is acked", outRan, true, actAck, 0},
		{"a cancelled job is acked", outCancelled, false, actAck, 0},
		{"an invalid job is terminated", outInvalid, false, actTerm, 0},
		{"an infrastructure failure is retried after a delay", outInfrastructure, false, actNak, delay},
		{"an infrastructure failure on the last delivery is given up", outInfrastructure, true, actTerm, 0},
		{"a redelivery of a job still running here is left to the running one", outDuplicate, false, actNone, 0},
		{"a job whose events were not stored is retried after a delay", outUnstored, false, actNak, delay},
		{"a job whose events were not stored on its last delivery is retried too, never terminated", outUnstored, true, actNak, delay},
		{"a redelivered job that an earlier attempt ended is acked", outEnded, false, actAck, 0},
		{"a job delivered past its last delivery, its end published, is terminated", outGaveUp, true, actTerm, 0},
		{"a job cut by the worker's shutdown goes back to the queue at once", outHandedOver, false, actNak, 0},
		{"a job cut by the worker's shutdown on its last delivery goes back to the queue too", outHandedOver, true, actNak, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, d := decide(tc.outcome, tc.last, delay)
			if got != tc.want || d != tc.wantDelay {
				t.Errorf("decide = %v after %v, want %v after %v", got, d, tc.want, tc.wantDelay)
			}
		})
	}
}
