package worker_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jazzmine/worker/imagebuild"
	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/wire"
)

// egressWorld is `worker serve` with two sandboxes: "a" (two warm containers)
// allowed svc-a:8080, "b" (one) allowed svc-b:8080. The targets are containers of
// the test on a network of the test, which the proxy sidecar is joined to. Their
// addresses are private: each sandbox's private_ranges name the network's subnet,
// or the proxy refuses the names.
type egressWorld struct {
	t       *testing.T
	runtime string // the sandboxes' OCI runtime ("" for the engine's default)
	srv     *server.Server
	agent   *agent
	suffix  string
	a, b    string            // the sandboxes' names
	net     string            // the targets' network
	subnet  string            // its address range
	ips     map[string]string // the targets' addresses, by service
	config  string            // the worker's config file
	worker  *workerProcess
	n       int // workers started
}

// newEgressWorld starts the targets and a worker with allowlist a for sandbox a,
// whose private_ranges are the targets' subnet only if aOptsIn, its sandboxes under
// the OCI runtime ("" for the engine's default). The targets, the sidecar, the
// sandboxes' volumes and the worker's containers are all removed when the test ends.
func newEgressWorld(t *testing.T, runtime, a string, aOptsIn bool) *egressWorld {
	testenv.SandboxImage(t)
	srv, nc := testenv.NATS(t)
	suffix := fmt.Sprint(time.Now().UnixNano() % 1_000_000)
	w := &egressWorld{t: t, runtime: runtime, srv: srv, agent: newAgent(t, nc), suffix: suffix, a: "a" + suffix, b: "b" + suffix,
		net: "jazzmine-test-targets-" + suffix, ips: map[string]string{}, config: filepath.Join(t.TempDir(), "config.yaml")}
	w.docker("network", "create", "--label", "jazzmine.test=worker", w.net)
	t.Cleanup(func() { _ = exec.Command("docker", "network", "rm", w.net).Run() })
	w.subnet = strings.Fields(w.docker("network", "inspect", "-f", "{{range .IPAM.Config}}{{.Subnet}} {{end}}", w.net) + " none")[0]
	if _, err := netip.ParsePrefix(w.subnet); err != nil {
		t.Fatalf("the subnet of network %s: %v", w.net, err)
	}
	for _, svc := range []string{"svc-a", "svc-b"} {
		id := w.docker("run", "-d", "--rm", "--label", "jazzmine.test=worker", "--network", w.net, "--network-alias", svc,
			"--entrypoint", "sh", imagebuild.DefaultBaseImage, "-c",
			fmt.Sprintf("mkdir -p /tmp/w && cd /tmp/w && echo hello from %s > index.html && (python3 -m http.server 8080 & python3 -m http.server 9090)", svc))
		t.Cleanup(func() { _ = exec.Command("docker", "rm", "-f", id).Run() })
		w.ips[svc] = w.docker("inspect", "-f", "{{(index .NetworkSettings.Networks \""+w.net+"\").IPAddress}}", id)
	}
	// After the worker's containers and the sidecar are gone (cleanups run last first).
	t.Cleanup(func() {
		for _, sb := range []string{w.a, w.b} {
			_ = exec.Command("docker", "volume", "rm", "-f", imagebuild.EgressVolume(sb)).Run()
		}
	})
	egressExisted := exec.Command("docker", "network", "inspect", imagebuild.EgressNetwork).Run() == nil
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := exec.Command("docker", "logs", imagebuild.ProxyContainer).CombinedOutput()
			t.Logf("proxy log:\n%s", logs)
		}
		_ = exec.Command("docker", "rm", "-f", imagebuild.ProxyContainer).Run()
		if !egressExisted { // the sidecar's network, made for this test
			_ = exec.Command("docker", "network", "rm", imagebuild.EgressNetwork).Run()
		}
	})
	w.writeAllowlists(a, aOptsIn)
	w.serve()
	return w
}

func (w *egressWorld) docker(args ...string) string {
	w.t.Helper()
	out, err := exec.Command("docker", args...).CombinedOutput()
	if err != nil {
		w.t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// writeAllowlists writes the worker's config with allowlist a for sandbox a, and the
// targets' subnet as a's private range if aOptsIn (always as b's).
func (w *egressWorld) writeAllowlists(a string, aOptsIn bool) {
	tools := filepath.Join(testenv.RepoRoot(), "examples", "tools", "*.py")
	aRanges := ""
	if aOptsIn {
		aRanges = fmt.Sprintf("%q", w.subnet)
	}
	cfg := fmt.Sprintf(`sandboxes:
  %[1]s:
    tools: [%[3]q]
    network: {allowed_hosts: [%[4]s], private_ranges: [%[5]s]}
    runtime: %[7]q
    pool: {size: 2, max_overflow: 0}
  %[2]s:
    tools: [%[3]q]
    network: {allowed_hosts: ["svc-b:8080"], private_ranges: [%[6]q]}
    runtime: %[7]q
    pool: {size: 1, max_overflow: 0}
`, w.a, w.b, tools, a, aRanges, w.subnet, w.runtime)
	if err := os.WriteFile(w.config, []byte(cfg), 0o644); err != nil {
		w.t.Fatal(err)
	}
}

// serve starts a worker, waits until it serves, and joins the sidecar to the
// targets' network (once more: a new sidecar is on none of the test's networks).
func (w *egressWorld) serve() {
	w.t.Helper()
	w.n++
	w.worker = startProcess(w.t, w.config, w.srv.ClientURL(), fmt.Sprintf("egress-%s-%d", w.suffix, w.n))
	w.worker.serving(w.t)
	onTargets := w.docker("inspect", "-f", "{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}", imagebuild.ProxyContainer)
	if !slices.Contains(strings.Fields(onTargets), w.net) {
		w.docker("network", "connect", w.net, imagebuild.ProxyContainer)
	}
}

// stop stops the worker; it removes its containers as it goes.
func (w *egressWorld) stop() {
	w.t.Helper()
	_ = w.worker.cmd.Process.Signal(os.Interrupt)
	if err := w.worker.cmd.Wait(); err != nil {
		w.t.Fatalf("worker exit: %v", err)
	}
}

// run runs script as a job of sandbox and returns its result and the container it
// ran in; a job that fails fails the test.
func (w *egressWorld) run(t *testing.T, sandbox, script string) (any, string) {
	t.Helper()
	jid := newID("egress")
	w.agent.submit(wire.ContentTypeMsgpack, wire.Job{ExecutionID: jid, Sandbox: sandbox, Script: script, TimeoutSec: 20})
	evs := w.agent.events(jid, time.Minute)
	done := last(evs)
	if !done.Success {
		t.Fatalf("%s: %s (events: %s)", sandbox, done.Error, describe(evs))
	}
	container := ""
	if ev := find(evs, wire.EventStarted); ev != nil {
		container = ev.ContainerID
	}
	return done.FinalData, container
}

// containers returns the short ids of the running containers of the sandbox.
func (w *egressWorld) containers(sandbox string) []string {
	return strings.Fields(w.docker("ps", "-q", "--filter", "label=jazzmine.sandbox="+sandbox, "--filter", "label=jazzmine.worker="+w.worker.id))
}

// fetch is a script that gets each URL through the proxy that HTTP_PROXY names, and
// returns each body, or the HTTP status of a refusal, or the exception's name.
const fetch = `
import urllib.request, urllib.error
out = {}
for url in %s:
    try:
        out[url] = urllib.request.urlopen(url, timeout=5).read().decode().strip()
    except urllib.error.HTTPError as e:
        out[url] = e.code
    except Exception as e:
        out[url] = type(e).__name__
emit_result(out)
`

// TestEachSandboxReachesOnlyItsOwnAllowlist: through HTTP_PROXY a sandbox reaches
// the targets of its own allowlist and is refused every other, the other sandbox's
// included; without it, it reaches nothing; the sidecar is replaced when, and only
// when, an allowlist changes.
func TestEachSandboxReachesOnlyItsOwnAllowlist(t *testing.T) {
	w := newEgressWorld(t, "", `"svc-a:8080"`, true)
	a, b := w.a, w.b

	got, _ := w.run(t, a, fmt.Sprintf(fetch, `["http://svc-a:8080/", "http://svc-b:8080/", "http://svc-a:9090/"]`))
	checkResult(t, "sandbox a", got, map[string]any{"http://svc-a:8080/": "hello from svc-a", "http://svc-b:8080/": float64(403), "http://svc-a:9090/": float64(403)})
	got, _ = w.run(t, b, fmt.Sprintf(fetch, `["http://svc-b:8080/", "http://svc-a:8080/"]`))
	checkResult(t, "sandbox b", got, map[string]any{"http://svc-b:8080/": "hello from svc-b", "http://svc-a:8080/": float64(403)})

	// Without the proxy variables, a script that opens sockets itself reaches nothing,
	// and the targets' names do not resolve. (Outside names are not tried: the test
	// sends no query that could leave this machine.)
	raw := fmt.Sprintf(`
import socket
out = {}
for name, addr in [("svc-a by ip", (%q, 8080)), ("svc-b by ip", (%q, 8080))]:
    try:
        socket.create_connection(addr, timeout=2).close()
        out[name] = "connected"
    except OSError as e:
        out[name] = "refused"
import threading
answer = []
def lookup():
    try:
        answer.append(socket.getaddrinfo("svc-a", 8080))
    except OSError:
        pass
t = threading.Thread(target=lookup, daemon=True)
t.start()
t.join(3)
out["svc-a"] = "resolved" if answer else "no answer"
emit_result(out)
`, w.ips["svc-a"], w.ips["svc-b"])
	got, _ = w.run(t, a, raw)
	checkResult(t, "raw sockets", got, map[string]any{"svc-a by ip": "refused", "svc-b by ip": "refused", "svc-a": "no answer"})

	// A restart with the same allowlists keeps the sidecar; a changed one replaces it,
	// and the change takes effect.
	sidecar := w.docker("inspect", "-f", "{{.Id}}", imagebuild.ProxyContainer)
	w.stop()
	w.serve()
	if now := w.docker("inspect", "-f", "{{.Id}}", imagebuild.ProxyContainer); now != sidecar {
		t.Errorf("the sidecar was replaced although no allowlist changed")
	}
	w.stop()
	w.writeAllowlists(`"svc-a:8080", "svc-a:9090"`, true)
	w.serve()
	if now := w.docker("inspect", "-f", "{{.Id}}", imagebuild.ProxyContainer); now == sidecar {
		t.Errorf("the sidecar was kept although an allowlist changed")
	}
	got, _ = w.run(t, a, fmt.Sprintf(fetch, `["http://svc-a:9090/"]`))
	checkResult(t, "sandbox a after the change", got, map[string]any{"http://svc-a:9090/": "hello from svc-a"})
}

// TestEgressRefusesANameResolvingToAPrivateAddressWithoutTheOptIn: svc-a resolves to
// an address of the test's network, as a name whose DNS an attacker controls can
// resolve to the Docker host's or a private service's; without the network's
// subnet in its private_ranges, sandbox a is refused it with a 403 and the proxy's
// log says why, while b, which opted in, reaches svc-b; once a opts in, the sidecar
// is replaced and a reaches svc-a.
func TestEgressRefusesANameResolvingToAPrivateAddressWithoutTheOptIn(t *testing.T) {
	w := newEgressWorld(t, "", `"svc-a:8080"`, false)
	a, b := w.a, w.b

	got, _ := w.run(t, a, fmt.Sprintf(fetch, `["http://svc-a:8080/"]`))
	checkResult(t, "sandbox a without private ranges", got, map[string]any{"http://svc-a:8080/": float64(403)})
	got, _ = w.run(t, b, fmt.Sprintf(fetch, `["http://svc-b:8080/"]`))
	checkResult(t, "sandbox b with the subnet as its private range", got, map[string]any{"http://svc-b:8080/": "hello from svc-b"})

	// Docker's address pools are RFC 1918 ranges unless the daemon says otherwise:
	// the test asks only that the reason names the address and the opt-in.
	why := []string{fmt.Sprintf("svc-a resolves only to refused addresses (%s is ", w.ips["svc-a"]), "and not in the sandbox's private_ranges)"}
	var refusal map[string]any
	testenv.WaitFor(t, 10*time.Second, "the proxy's log line for the refusal", func() bool {
		logs, _ := exec.Command("docker", "logs", imagebuild.ProxyContainer).CombinedOutput()
		for line := range strings.Lines(string(logs)) {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "proxy: refused" && m["sandbox"] == a && m["target"] == "svc-a:8080" {
				refusal = m
				return true
			}
		}
		return false
	})
	if reason, _ := refusal["reason"].(string); refusal["level"] != "WARN" || refusal["status"] != float64(403) ||
		!strings.Contains(reason, why[0]) || !strings.Contains(reason, why[1]) {
		t.Errorf("the proxy logged %v; want a WARN, status 403, and a reason with %q", refusal, why)
	}

	sidecar := w.docker("inspect", "-f", "{{.Id}}", imagebuild.ProxyContainer)
	w.stop()
	w.writeAllowlists(`"svc-a:8080"`, true)
	w.serve()
	if now := w.docker("inspect", "-f", "{{.Id}}", imagebuild.ProxyContainer); now == sidecar {
		t.Errorf("the sidecar was kept although a's private ranges changed")
	}
	got, _ = w.run(t, a, fmt.Sprintf(fetch, `["http://svc-a:8080/"]`))
	checkResult(t, "sandbox a with the subnet as its private range", got, map[string]any{"http://svc-a:8080/": "hello from svc-a"})
}

// hostListener listens on every address of the host, as a service bound to 0.0.0.0
// does, and counts the connections it accepts.
type hostListener struct {
	ln   net.Listener
	port int
	mu   sync.Mutex // guards from
	from []string
}

func listenOnTheHost(t *testing.T) *hostListener {
	t.Helper()
	ln, err := net.Listen("tcp", ":0") // 0.0.0.0 and [::]
	if err != nil {
		t.Fatal(err)
	}
	h := &hostListener{ln: ln, port: ln.Addr().(*net.TCPAddr).Port}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h.mu.Lock()
			h.from = append(h.from, c.RemoteAddr().String())
			h.mu.Unlock()
			c.Close()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
	})
	return h
}

// accepted returns the sources of the connections accepted so far, and forgets them.
func (h *hostListener) accepted() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	from := h.from
	h.from = nil
	return from
}

// reach is a script that tries a TCP connection to each [label, host, port] and
// returns those it made, and how many it tried.
const reach = `
import socket
out = {"connected": [], "tried": 0}
for label, host, port in %s:
    out["tried"] += 1
    try:
        socket.create_connection((host, port), timeout=2).close()
        out["connected"].append("%%s %%s:%%d" %% (label, host, port))
    except OSError:
        pass
emit_result(out)
`

// TestAScriptWithAnAllowlistReachesTheProxyAndNothingElse plays the attacker of
// docs/SECURITY.md, who has read this repository: a script of a sandbox with an
// allowlist tries every way out past the proxy, and past its own allowlist, that the
// old design (a bridge network per sandbox) or this one might leave. Under each
// runtime: under gVisor the relay reaches the proxy's socket through runsc's
// --host-uds=open (make gvisor), and the sandbox's network is gVisor's own loopback
// (--network=none).
func TestAScriptWithAnAllowlistReachesTheProxyAndNothingElse(t *testing.T) {
	testenv.EachRuntimeInTurn(t, egressAttackUnder)
}

func egressAttackUnder(t *testing.T, runtime string) {
	w := newEgressWorld(t, runtime, `"svc-a:8080"`, true)
	a, b := w.a, w.b
	host := listenOnTheHost(t)

	// Every address of the host that the test can list: its interfaces', and the
	// gateways of Docker's bridges (the default one, the sidecar's routed one, the
	// test's), which are the host's addresses on them.
	var hostAddrs []string
	ifaddrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, ia := range ifaddrs {
		if ipn, ok := ia.(*net.IPNet); ok && !ipn.IP.IsLinkLocalUnicast() {
			hostAddrs = append(hostAddrs, ipn.IP.String())
		}
	}
	gateways := map[string]string{}
	for _, n := range []string{"bridge", imagebuild.EgressNetwork, w.net} {
		gw := w.docker("network", "inspect", "-f", "{{range .IPAM.Config}}{{.Gateway}} {{end}}", n)
		if f := strings.Fields(gw); len(f) > 0 {
			gateways[n] = f[0]
			continue
		}
		// The default bridge may list no gateway: it is its interface's address.
		ifi, err := net.InterfaceByName(w.docker("network", "inspect", "-f", `{{index .Options "com.docker.network.bridge.name"}}`, n))
		if err != nil {
			continue
		}
		addrs, _ := ifi.Addrs()
		for _, ia := range addrs {
			if ipn, ok := ia.(*net.IPNet); ok && ipn.IP.To4() != nil {
				gateways[n] = ipn.IP.String()
			}
		}
	}
	for n, gw := range gateways {
		hostAddrs = append(hostAddrs, gw)
		t.Logf("the host's address on %s: %s", n, gw)
	}
	slices.Sort(hostAddrs)
	hostAddrs = slices.Compact(hostAddrs)
	if len(gateways) != 3 || !slices.Contains(hostAddrs, "127.0.0.1") {
		t.Fatalf("the host's addresses %v lack a bridge's gateway (%v) or loopback", hostAddrs, gateways)
	}
	t.Logf("the host's addresses: %v", hostAddrs)
	// The control: from a container on a bridge, the host's listener IS reachable
	// through the gateway; that is what a sandbox on a bridge could do.
	svcA := w.docker("ps", "-q", "--filter", "network="+w.net, "--filter", "label=jazzmine.test=worker")
	for _, id := range strings.Fields(svcA)[:1] {
		w.docker("exec", id, "python3", "-c", fmt.Sprintf("import socket; socket.create_connection((%q, %d), timeout=5).close()", gateways[w.net], host.port))
	}
	testenv.WaitFor(t, 10*time.Second, "the control connection", func() bool { return len(host.accepted()) > 0 })

	proxyAddrs := strings.Fields(w.docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}", imagebuild.ProxyContainer))
	if len(proxyAddrs) < 2 {
		t.Fatalf("the sidecar's addresses: %v, want one on %s and one on %s", proxyAddrs, imagebuild.EgressNetwork, w.net)
	}
	type target struct {
		label string
		host  string
		port  int
	}
	asList := func(ts []target) string {
		var rows [][]any
		for _, x := range ts {
			rows = append(rows, []any{x.label, x.host, x.port})
		}
		b, _ := json.Marshal(rows)
		return string(b)
	}
	checkReach := func(t *testing.T, sandbox string, ts []target) {
		t.Helper()
		got, _ := w.run(t, sandbox, fmt.Sprintf(reach, asList(ts)))
		checkResult(t, "connections made", got, map[string]any{"connected": []any{}, "tried": float64(len(ts))})
	}

	t.Run("a script cannot reach the host on any of its addresses, bridge gateways included", func(t *testing.T) {
		var ts []target
		for _, ip := range hostAddrs {
			ts = append(ts, target{"host", ip, host.port})
		}
		checkReach(t, a, ts)
		// Nor through the proxy: the host's addresses are in no allowlist. (127.0.0.1
		// is in NO_PROXY: a client connects to the container's own loopback, tried above.)
		var urls []string
		want := map[string]any{}
		for _, ip := range hostAddrs {
			if ip == "127.0.0.1" {
				continue
			}
			u := fmt.Sprintf("http://%s/", net.JoinHostPort(ip, fmt.Sprint(host.port)))
			urls = append(urls, u)
			want[u] = float64(403)
		}
		list, _ := json.Marshal(urls)
		got, _ := w.run(t, a, fmt.Sprintf(fetch, list))
		checkResult(t, "through the proxy", got, want)
		if from := host.accepted(); len(from) > 0 {
			t.Errorf("the host's listener accepted connections from %v", from)
		}
	})

	t.Run("a script has no network: no other container of its sandbox, nor any other, is reachable", func(t *testing.T) {
		ids := w.containers(a)
		if len(ids) != 2 {
			t.Fatalf("sandbox a has containers %v, want 2", ids)
		}
		for _, id := range append(ids, w.containers(b)...) {
			mode := w.docker("inspect", "-f", "{{.HostConfig.NetworkMode}} {{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", id)
			if mode != "none" {
				t.Errorf("container %s: network %q, want none and no address", id, mode)
			}
		}
		idsJSON, _ := json.Marshal(ids)
		got, _ := w.run(t, a, fmt.Sprintf(`
import errno, socket
out = {"ifaces": [name for _, name in socket.if_nameindex()]}
with open("/proc/net/route") as f:
    out["routes"] = len(f.read().splitlines()) - 1
out["resolved"] = []
for other in %s:  # the ids of the sandbox's containers, as Docker names their hosts
    if other == socket.gethostname():
        continue
    try:
        socket.getaddrinfo(other, 80)
        out["resolved"].append(other)
    except OSError:
        pass
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    s.sendto(b"x", ("255.255.255.255", 9))
    out["broadcast"] = "sent"
except OSError as e:
    out["broadcast"] = errno.errorcode[e.errno]
emit_result(out)
`, idsJSON))
		checkResult(t, "the network a script sees", got, map[string]any{
			"broadcast": "ENETUNREACH", "ifaces": []any{"lo"}, "resolved": []any{}, "routes": float64(0)})
		// The addresses Docker knows for other containers: the targets', the
		// sidecar's (on its routed network and on the targets').
		var ts []target
		for svc, ip := range w.ips {
			ts = append(ts, target{svc, ip, 8080})
		}
		for _, ip := range proxyAddrs {
			ts = append(ts, target{"sidecar", ip, 3128}, target{"sidecar", ip, 8080})
		}
		checkReach(t, a, ts)
		checkReach(t, b, ts)
	})

	t.Run("a script sees only its own sandbox's socket, and the other sandbox's allowlist is refused", func(t *testing.T) {
		other := path.Join(imagebuild.ProxyDir, b, imagebuild.ProxySocket) // where the sidecar has it
		got, _ := w.run(t, a, fmt.Sprintf(`
import errno, os, socket, stat
out = {"listing": sorted(os.listdir("/run/jazzmine/egress"))}
out["mounts"] = sorted(line.split()[4] + " " + line.split()[5].split(",")[0]
                       for line in open("/proc/self/mountinfo") if "/run/jazzmine" in line.split()[4])
for name, p in [("the other's path", %q), ("a path up", "/run/jazzmine/egress/../%s/proxy.sock")]:
    try:
        socket.socket(socket.AF_UNIX).connect(p)
        out[name] = "connected"
    except OSError as e:
        out[name] = errno.errorcode[e.errno]
out["sockets"] = []
for root, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(root, d) not in ("/proc", "/sys", "/usr")]
    for f in files:
        try:
            if stat.S_ISSOCK(os.lstat(os.path.join(root, f)).st_mode):
                out["sockets"].append(os.path.join(root, f))
        except OSError:
            pass
emit_result(out)
`, other, b))
		checkResult(t, "what sandbox a sees", got, map[string]any{
			"a path up": "ENOENT", "listing": []any{"proxy.sock"}, "mounts": []any{"/run/jazzmine/egress ro"},
			"sockets": []any{"/run/jazzmine/egress/proxy.sock"}, "the other's path": "ENOENT"})
		got, _ = w.run(t, a, fmt.Sprintf(fetch, `["http://svc-b:8080/"]`))
		checkResult(t, "sandbox a asking for b's target", got, map[string]any{"http://svc-b:8080/": float64(403)})
	})

	t.Run("a script cannot replace its socket nor keep the relay's port, and the next job's relay works", func(t *testing.T) {
		got, first := w.run(t, b, `
import errno, os, socket
d = "/run/jazzmine/egress"
p = d + "/proxy.sock"
out = {}
def attempt(name, f):
    try:
        f()
        out[name] = "done"
    except OSError as e:
        out[name] = errno.errorcode[e.errno]
attempt("unlink", lambda: os.unlink(p))
attempt("rename", lambda: os.rename(p, d + "/old.sock"))
attempt("bind over it", lambda: socket.socket(socket.AF_UNIX).bind(p))
attempt("bind beside it", lambda: socket.socket(socket.AF_UNIX).bind(d + "/evil.sock"))
attempt("create a file", lambda: open(d + "/x", "w"))
attempt("chmod", lambda: os.chmod(p, 0o600))
# The relay's listener is a descriptor of this process: take a copy, and leave a
# daemon (a setsid double fork) answering on it for the jobs to come.
port = int(os.environ["JAZZMINE_EGRESS_PORT"])
listener = None
for fd in range(3, 256):
    try:
        s = socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM)
        if s.getsockname()[1] == port:
            listener = s
            break
        s.close()
    except Exception:
        pass
out["found the relay's listener"] = listener is not None
if listener is not None and os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        listener.setblocking(True)
        while True:
            c, _ = listener.accept()
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\nConnection: close\r\n\r\nintercepted")
            c.close()
    os._exit(0)
emit_result(out)
`)
		want := map[string]any{
			"bind beside it": "EROFS", "bind over it": "EADDRINUSE", "chmod": "EROFS", "create a file": "EROFS",
			"found the relay's listener": true, "rename": "EROFS", "unlink": "EROFS"}
		if runtime == sandboxpool.GVisor {
			// gVisor checks the directory's owner (the proxy's user) and mode before
			// the mount's read-only flag: refused all the same.
			want["chmod"], want["create a file"], want["unlink"] = "EPERM", "EACCES", "EACCES"
		}
		checkResult(t, "tampering", got, want)
		got, next := w.run(t, b, fmt.Sprintf(fetch, `["http://svc-b:8080/", "http://svc-b:8080/index.html"]`))
		checkResult(t, "the next job", got, map[string]any{"http://svc-b:8080/": "hello from svc-b", "http://svc-b:8080/index.html": "hello from svc-b"})
		if next != first {
			t.Logf("the next job ran in container %s, not %s: the first was retired", next, first)
		}
	})

	if from := host.accepted(); len(from) > 0 {
		t.Errorf("the host's listener accepted connections from %v", from)
	}
}

func checkResult(t *testing.T, what string, got any, want map[string]any) {
	t.Helper()
	g, _ := json.Marshal(got)
	w, _ := json.Marshal(want)
	if string(g) != string(w) {
		t.Errorf("%s: got %s, want %s", what, g, w)
	}
}
