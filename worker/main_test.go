package worker_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/jazzmine/worker/internal/testenv"
)

// TestMain fails the package if any goroutine outlives the tests (the shared Docker
// client's idle connections are closed first: they are not the worker's).
func TestMain(m *testing.M) {
	code := m.Run()
	testenv.CloseDocker()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
