package client_test

import (
	"testing"

	"github.com/jazzmine/worker/internal/testenv"
)

// TestMain fails the package if a goroutine outlives the tests: the
// executions' readers, nats.go's and the in-process servers' included (the
// examples' worker's shared Docker client is closed first).
func TestMain(m *testing.M) { testenv.Main(m) }
