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
)

func (o outcome) String() string {
	return [...]string{"ran", "cancelled", "invalid", "infrastructure", "duplicate", "unstored"}[o]
}

// decide maps an outcome to a JetStream action. An infrastructure failure is retried
// until the last delivery, which is given up (after a terminal event) instead. A job
// whose events could not be stored is never given up by its worker, which could not
// store its end either: it is retried, and on its last delivery nakked at once, so
// that the server announces it out of deliveries and a worker of the fleet publishes
// its end (Worker.maxDeliveries).
func decide(o outcome, lastDelivery bool, nakDelay time.Duration) (action, time.Duration) {
	switch o {
	case outDuplicate:
		return actNone, 0
	case outInvalid:
		return actTerm, 0
	case outInfrastructure:
		if lastDelivery {
			return actTerm, 0
		}
		return actNak, nakDelay
	case outUnstored:
		if lastDelivery {
			return actNak, 0
		}
		return actNak, nakDelay
	default:
		return actAck, 0
	}
}
