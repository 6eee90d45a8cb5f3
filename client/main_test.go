package client_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a goroutine outlives the tests: the
// executions' readers, nats.go's and the in-process servers' included.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
