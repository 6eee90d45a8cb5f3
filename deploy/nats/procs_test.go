package nats_test

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	natsdeploy "github.com/jazzmine/worker/deploy/nats"
	"github.com/jazzmine/worker/internal/testenv"
)

// process is a server or worker the test runs as its own OS process.
type process struct {
	name   string
	cmd    *exec.Cmd
	log    *syncWriter
	exited chan struct{} // closed once the process has exited and been waited for
}

// start runs bin with args and env added to the test's environment. At the end of the
// test a process still running gets SIGTERM, and SIGKILL if it has not exited within
// grace; its output is logged if the test failed.
func start(t testing.TB, name string, grace time.Duration, env []string, bin string, args ...string) *process {
	t.Helper()
	p := &process{name: name, cmd: exec.Command(bin, args...), log: &syncWriter{}, exited: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		if p.running() {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.exited:
			case <-time.After(grace):
				_ = p.cmd.Process.Kill()
				<-p.exited
			}
		}
		if t.Failed() {
			t.Logf("output of %s:\n%s", name, p.log.String())
		}
	})
	return p
}

func (p *process) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// kill ends the process with SIGKILL, as a crash or the OOM killer would.
func (p *process) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatalf("kill %s: %v", p.name, err)
	}
	<-p.exited
}

// waitUntil waits for cond like waitFor, and fails at once if the process exits.
func (p *process) waitUntil(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	testenv.WaitFor(t, within, what, func() bool {
		if !p.running() {
			t.Fatalf("%s exited while waiting for %s: %v\n%s", p.name, what, p.cmd.ProcessState, p.log.String())
		}
		return cond()
	})
}

type syncWriter struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(b)
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// natsServer is one node of the test's cluster.
type natsServer struct {
	*process
	url string // client URL, on loopback
}

// clusterKeys are the seed files of the two users auth.conf knows, the workers and
// the agents of the tenant agents, for a cluster whose nodes have their public keys.
// clusterKeys are the seed files of the cluster's users: the worker, the agent of
// the static auth.conf, and each tenant's agent when the cluster runs a generated one.
type clusterKeys struct {
	worker, agent string
	tenants       map[string]string
}

// startCluster runs n nats-server processes with deploy/nats/cluster.conf, the
// configuration the compose file runs, on loopback ports given as flags (flags
// override the file), each with its own store and with new keys for the users of
// the auth.conf it includes, and returns once every node accepts clients, with the
// keys' seed files. JetStream may still be electing its meta leader then.
func startCluster(t testing.TB, n int) ([]*natsServer, clusterKeys) {
	return startClusterOf(t, n, nil)
}

// startClusterOf is startCluster with, when tenants are named, an auth.conf rendered
// for them (AuthConfig, as `worker nats-auth` writes it) beside a copy of
// cluster.conf, and a key for each tenant's agents.
func startClusterOf(t testing.TB, n int, tenants []string) ([]*natsServer, clusterKeys) {
	t.Helper()
	bin := testenv.StaticBinary(t, "github.com/nats-io/nats-server/v2")
	conf := filepath.Join(testenv.RepoRoot(), "deploy", "nats", "cluster.conf")
	workerSeed, workerPub := testenv.UserKey(t)
	agentSeed, agentPub := testenv.UserKey(t)
	keys := clusterKeys{worker: testenv.WriteSeed(t, workerSeed), agent: testenv.WriteSeed(t, agentSeed)}
	if len(tenants) > 0 {
		conf = tenantsClusterConf(t, conf, workerPub, tenants, &keys)
	}
	ports := freePorts(t, 3*n) // client, cluster and monitoring port of each node
	var routes []string
	for i := range n {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", ports[3*i+1]))
	}
	var servers []*natsServer
	for i := range n {
		name := fmt.Sprintf("nats-%d", i+1)
		env := []string{"NATS_SERVER_NAME=" + name, "NATS_STORE_DIR=" + t.TempDir(),
			"JAZZMINE_WORKER_NKEY=" + workerPub, "JAZZMINE_AGENT_NKEY=" + agentPub}
		p := start(t, name, 30*time.Second, env, bin,
			"--config", conf,
			"--addr", "127.0.0.1", "--port", strconv.Itoa(ports[3*i]),
			"--http_port", strconv.Itoa(ports[3*i+2]),
			"--cluster", fmt.Sprintf("nats://127.0.0.1:%d", ports[3*i+1]),
			"--routes", strings.Join(routes, ","))
		servers = append(servers, &natsServer{process: p, url: fmt.Sprintf("nats://127.0.0.1:%d", ports[3*i])})
	}
	for _, s := range servers {
		s.waitUntil(t, 30*time.Second, s.name+" to accept clients", func() bool {
			c, err := net.DialTimeout("tcp", strings.TrimPrefix(s.url, "nats://"), time.Second)
			if err == nil {
				c.Close()
			}
			return err == nil
		})
	}
	return servers, keys
}

// tenantsClusterConf writes a copy of the cluster configuration conf beside an
// auth.conf rendered for the worker's key and a new key for each tenant, whose seed
// files it adds to keys; it returns the copy's path.
func tenantsClusterConf(t testing.TB, conf, workerPub string, tenants []string, keys *clusterKeys) string {
	keys.tenants = map[string]string{}
	var ts []natsdeploy.Tenant
	for _, name := range tenants {
		seed, pub := testenv.UserKey(t)
		keys.tenants[name] = testenv.WriteSeed(t, seed)
		ts = append(ts, natsdeploy.Tenant{Name: name, Key: pub})
	}
	auth, err := natsdeploy.AuthConfig([]string{workerPub}, ts)
	if err != nil {
		t.Fatal(err)
	}
	cluster, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, data := range map[string][]byte{"auth.conf": []byte(auth), "cluster.conf": cluster} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "cluster.conf")
}

// freePorts returns n distinct loopback ports that were free a moment ago.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close() // all held until the end, so that no two are the same
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports
}
