package sandboxpool_test

import (
	"testing"

	"github.com/jazzmine/worker/internal/testenv"
)

// TestMain fails the package if any goroutine outlives its tests.
func TestMain(m *testing.M) { testenv.Main(m) }
