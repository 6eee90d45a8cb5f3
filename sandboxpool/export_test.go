package sandboxpool

// Timers of the pool that the logic tests wait out on synctest's clock.
const (
	Backoff          = backoff
	MaintainInterval = maintainInterval
)
