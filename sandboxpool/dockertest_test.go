package sandboxpool_test

import (
	"testing"

	"github.com/moby/moby/client"

	"github.com/jazzmine/worker/internal/testenv"
)

// docker is the local engine (see testenv.Docker).
func docker(t testing.TB) *client.Client { return testenv.Docker(t) }
