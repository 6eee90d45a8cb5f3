// The tests of the deployment in this directory: the fault test runs the cluster
// configuration of cluster.conf as three nats-server processes with two `worker
// serve` processes, and the Docker-out-of-Docker test runs the worker's image
// (worker.Dockerfile, built by images.sh) against the host's Docker.
package nats_test

import (
	"os"
	"testing"

	"github.com/jazzmine/worker/internal/testenv"
)

// TestMain fails the package if any goroutine outlives its tests. Started with
// simWorkerEnv set, the binary is a simulated worker of BenchmarkScale instead.
func TestMain(m *testing.M) {
	if os.Getenv(simWorkerEnv) != "" {
		os.Exit(runSimWorker())
	}
	testenv.Main(m)
}
