package worker_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jazzmine/worker/imagebuild"
	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/wire"
)

// TestEachSandboxReachesOnlyItsOwnAllowlist runs `worker serve` with two sandboxes:
// "a" allowed svc-a:8080, "b" allowed svc-b:8080. The targets are containers of the
// test on a network of the test, which the proxy sidecar is joined to.
func TestEachSandboxReachesOnlyItsOwnAllowlist(t *testing.T) {
	testenv.SandboxImage(t)
	srv, nc := testenv.NATS(t)
	docker := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("docker", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	suffix := fmt.Sprint(time.Now().UnixNano() % 1_000_000)
	targets := "jazzmine-test-targets-" + suffix
	docker("network", "create", "--label", "jazzmine.test=worker", targets)
	t.Cleanup(func() { _ = exec.Command("docker", "network", "rm", targets).Run() })
	ips := map[string]string{}
	for _, svc := range []string{"svc-a", "svc-b"} {
		id := docker("run", "-d", "--rm", "--label", "jazzmine.test=worker", "--network", targets, "--network-alias", svc,
			"--entrypoint", "sh", imagebuild.DefaultBaseImage, "-c",
			fmt.Sprintf("mkdir -p /tmp/w && cd /tmp/w && echo hello from %s > index.html && (python3 -m http.server 8080 & python3 -m http.server 9090)", svc))
		t.Cleanup(func() { _ = exec.Command("docker", "rm", "-f", id).Run() })
		ips[svc] = docker("inspect", "-f", "{{(index .NetworkSettings.Networks \""+targets+"\").IPAddress}}", id)
	}
	tools := filepath.Join(testenv.RepoRoot(), "examples", "tools", "*.py")
	path := filepath.Join(t.TempDir(), "config.yaml")
	writeAllowlists := func(a string) {
		cfg := fmt.Sprintf(`sandboxes:
  a%[1]s:
    tools: [%[2]q]
    network: {allowed_hosts: [%[3]s]}
    pool: {size: 1, max_overflow: 0}
  b%[1]s:
    tools: [%[2]q]
    network: {allowed_hosts: ["svc-b:8080"]}
    pool: {size: 1, max_overflow: 0}
`, suffix, tools, a)
		if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeAllowlists(`"svc-a:8080"`)
	t.Cleanup(func() { // after the worker has removed its containers (cleanups run last first)
		for _, sb := range []string{"a" + suffix, "b" + suffix} {
			_ = exec.Command("docker", "network", "rm", imagebuild.NetworkName(sb)).Run()
		}
	})
	serve := func(n int) *workerProcess {
		p := startProcess(t, path, srv.ClientURL(), fmt.Sprintf("egress-%s-%d", suffix, n))
		testenv.WaitFor(t, 3*time.Minute, "the worker to serve", func() bool { return strings.Contains(p.log.String(), "msg=serving") })
		return p
	}
	stop := func(p *workerProcess) {
		_ = p.cmd.Process.Signal(os.Interrupt)
		if err := p.cmd.Wait(); err != nil {
			t.Fatalf("worker exit: %v", err)
		}
	}
	p := serve(1)
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := exec.Command("docker", "logs", imagebuild.ProxyContainer).CombinedOutput()
			t.Logf("proxy log:\n%s", logs)
		}
		_ = exec.Command("docker", "rm", "-f", imagebuild.ProxyContainer).Run()
	})
	docker("network", "connect", targets, imagebuild.ProxyContainer) // where the targets live

	a := newAgent(t, nc)
	run := func(sandbox, script string) any {
		t.Helper()
		jid := newID("egress")
		a.submit(wire.ContentTypeMsgpack, wire.Job{ExecutionID: jid, Sandbox: sandbox, Script: script, TimeoutSec: 20})
		done := last(a.events(jid, time.Minute))
		if !done.Success {
			t.Fatalf("%s: %s", sandbox, done.Error)
		}
		return done.FinalData
	}
	fetch := `
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
	got := run("a"+suffix, fmt.Sprintf(fetch, `["http://svc-a:8080/", "http://svc-b:8080/", "http://svc-a:9090/"]`))
	want := map[string]any{"http://svc-a:8080/": "hello from svc-a", "http://svc-b:8080/": float64(403), "http://svc-a:9090/": float64(403)}
	checkResult(t, "sandbox a", got, want)
	got = run("b"+suffix, fmt.Sprintf(fetch, `["http://svc-b:8080/", "http://svc-a:8080/"]`))
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
`, ips["svc-a"], ips["svc-b"])
	checkResult(t, "raw sockets", run("a"+suffix, raw), map[string]any{
		"svc-a by ip": "refused", "svc-b by ip": "refused", "svc-a": "no answer"})

	// A restart with the same allowlists keeps the sidecar; a changed one replaces it,
	// and the change takes effect.
	sidecar := docker("inspect", "-f", "{{.Id}}", imagebuild.ProxyContainer)
	stop(p)
	p = serve(2)
	if now := docker("inspect", "-f", "{{.Id}}", imagebuild.ProxyContainer); now != sidecar {
		t.Errorf("the sidecar was replaced although no allowlist changed")
	}
	stop(p)
	writeAllowlists(`"svc-a:8080", "svc-a:9090"`)
	serve(3)
	if now := docker("inspect", "-f", "{{.Id}}", imagebuild.ProxyContainer); now == sidecar {
		t.Errorf("the sidecar was kept although an allowlist changed")
	}
	docker("network", "connect", targets, imagebuild.ProxyContainer)
	checkResult(t, "sandbox a after the change", run("a"+suffix, fmt.Sprintf(fetch, `["http://svc-a:9090/"]`)),
		map[string]any{"http://svc-a:9090/": "hello from svc-a"})
}

func checkResult(t *testing.T, what string, got any, want map[string]any) {
	t.Helper()
	g, _ := json.Marshal(got)
	w, _ := json.Marshal(want)
	if string(g) != string(w) {
		t.Errorf("%s: got %s, want %s", what, g, w)
	}
}
