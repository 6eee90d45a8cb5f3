package worker

import "time"

// action is what happens to a job message after a delivery.
type action int

const (
	actAck  action = iota // done: events published
	actNak                // retry after a delay
	actTerm               // never again
	actNone               // leave it: another delivery answers for it
)

func (a action) String() string {
	return [...]string{"ack", "nak", "term", "none"}[a]
}

// outcome is how a delivery of a job ended.
type outcome int

const (
	outRan            outcome = iota // the script ran; its own failure is still a result
	outCancelled                     // cancelled before or while it ran; events published
	outInvalid                       // undecodable or invalid job
	outInfrastructure                // no container; its end is published on the last delivery
	outDuplicate                     // redelivered while its first delivery still runs here
	outUnstored                      // its events, or its end, could not all be stored
	outEnded                         // an earlier attempt stored its script_done: not run again
	outGaveUp                        // delivered past MaxDeliver: its end published, never run again
	outHandedOver                    // cut by the worker's shutdown: back to the queue, no script_done
)

func (o outcome) String() string {
	return [...]string{"ran", "cancelled", "invalid", "infrastructure", "duplicate", "unstored", "ended", "gave_up", "handed_over"}[o]
}

// decide maps an outcome to a JetStream action. An infrastructure failure is retried
// until the last delivery, which is given up (after a terminal event) instead. A job
// whose events could not be stored is never given up by its worker, which could not
// store its end either: it is retried after nakDelay (the caller grows it past the
// last delivery), and a delivery past the last ends it (see job.go, ended). A job cut by
// the worker's shutdown goes back to the queue at once, for another worker.
func decide(o outcome, lastDelivery bool, nakDelay time.Duration) (action, time.Duration) {
	switch o {
	case outDuplicate:
		return actNone, 0
	case outInvalid, outGaveUp:
		return actTerm, 0
	case outInfrastructure:
		if lastDelivery {
			return actTerm, 0
		}
		return actNak, nakDelay
	case outUnstored:
		return actNak, nakDelay
	case outHandedOver:
		return actNak, 0
	default:
		return actAck, 0
	}
}
