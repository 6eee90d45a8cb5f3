package sandboxpool_test

import (
	"context"

	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/jazzmine/worker/harness"
	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/sandboxpool"
)

// testImage is the image of the example config's "default" sandbox.
func testImage(t testing.TB) string { return testenv.SandboxImage(t).Tag }

func sandbox(t testing.TB, name string, poolSize, overflow int) sandboxpool.Sandbox {
	return sandboxpool.Sandbox{Name: name, Image: testImage(t), PoolSize: poolSize, MaxOverflow: overflow, ReadyTimeout: 60 * time.Second}
}

// sandboxUnder is sandbox with the OCI runtime rt (testenv.Runtimes).
func sandboxUnder(t testing.TB, rt, name string, poolSize, overflow int) sandboxpool.Sandbox {
	sb := sandbox(t, name, poolSize, overflow)
	sb.Runtime = rt
	return sb
}

// newPool starts a pool with a worker id of its own and, at cleanup, closes it and
// checks with the Docker API that none of its containers is left.
func newPool(t testing.TB, cfg sandboxpool.Config) *sandboxpool.Pool {
	t.Helper()
	cfg.Docker = docker(t)
	if cfg.WorkerID == "" {
		cfg.WorkerID = fmt.Sprintf("test-%s-%d", strings.ReplaceAll(t.Name(), "/", "-"), time.Now().UnixNano())
	}
	p, err := sandboxpool.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if err := p.Close(ctx); err != nil {
			t.Errorf("close pool: %v", err)
		}
		if left := testenv.ContainersOf(t, cfg.WorkerID); len(left) > 0 {
			t.Errorf("containers left after Close: %v", left)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	if err := p.Start(ctx); err != nil {
		t.Fatalf("start pool: %v", err)
	}
	return p
}

func checkout(t testing.TB, p *sandboxpool.Pool, name string) *sandboxpool.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l, err := p.Checkout(ctx, name)
	if err != nil {
		t.Fatalf("checkout %s: %v", name, err)
	}
	return l
}

func run(t testing.TB, l *sandboxpool.Lease, script string, opts ...func(*harness.Request)) *harness.Result {
	t.Helper()
	req := harness.Request{ExecutionID: fmt.Sprintf("x%d", time.Now().UnixNano()), Script: script, Timeout: 20 * time.Second}
	for _, o := range opts {
		o(&req)
	}
	res, err := l.Run(context.Background(), req, nil)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	return res
}

func stats(p *sandboxpool.Pool, name string) sandboxpool.SandboxStats {
	return p.Stats().Sandboxes[name]
}

func TestAWarmPoolLendsAContainerAtOnce(t *testing.T) {
	p := newPool(t, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{sandbox(t, "warm", 2, 0)}})
	if s := stats(p, "warm"); s.Idle != 2 || s.Total != 2 {
		t.Fatalf("after Start: %+v, want 2 idle", s)
	}
	l := checkout(t, p, "warm")
	defer l.Release()
	if s := stats(p, "warm"); s.Idle != 1 || s.InUse != 1 || s.CheckoutWaits != 0 {
		t.Errorf("after checkout: %+v, want 1 idle, 1 in use, no wait", s)
	}
	res := run(t, l, "emit_result(6 * 7)")
	if !res.Success || string(res.FinalData) != "42" {
		t.Errorf("result: %+v", res)
	}
	if !slices.Contains(testenv.ContainersOf(t, workerOf(p)), l.ContainerID()) {
		t.Errorf("container %s is not labelled with the worker id", l.ContainerID())
	}
}

func workerOf(p *sandboxpool.Pool) string { return p.WorkerID() }

func TestOverflowAndBlockingCheckout(t *testing.T) {
	p := newPool(t, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{sandbox(t, "ovf", 1, 1)}})
	a := checkout(t, p, "ovf")
	b := checkout(t, p, "ovf") // spawned as overflow
	if a.ContainerID() == b.ContainerID() {
		t.Fatal("two leases share a container")
	}
	if s := stats(p, "ovf"); s.Total != 2 || s.InUse != 2 {
		t.Fatalf("stats with two leases: %+v", s)
	}
	// At capacity: a third caller waits until its ctx ends...
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err := p.Checkout(ctx, "ovf")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("checkout at capacity: err = %v, want deadline exceeded", err)
	}
	if s := stats(p, "ovf"); s.Total != 2 || s.Waiting != 0 {
		t.Errorf("after a caller gave up: %+v, want 2 containers and no waiter", s)
	}
	// ...or until a container comes back.
	got := make(chan *sandboxpool.Lease)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		l, err := p.Checkout(ctx, "ovf")
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	testenv.WaitFor(t, 10*time.Second, "the caller should be waiting", func() bool { return stats(p, "ovf").Waiting == 1 })
	a.Release()
	c := <-got
	if c == nil || c.ContainerID() != a.ContainerID() {
		t.Fatalf("the waiting caller got %v, want the returned container %s", c, a.ContainerID())
	}
	res := run(t, c, "emit_result('reused')")
	if !res.Success {
		t.Errorf("run on the reused container: %+v", res)
	}
	c.Release()
	b.Release()
	b.Release() // twice is fine
}

func TestContainersAreRecycledAfterMaxUses(t *testing.T) {
	sb := sandbox(t, "uses", 1, 0)
	sb.MaxUses = 2
	p := newPool(t, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{sb}})
	var ids []string
	use := func(i int) {
		l := checkout(t, p, "uses")
		ids = append(ids, l.ContainerID())
		if res := run(t, l, fmt.Sprintf("emit_result(%d)", i)); !res.Success {
			t.Fatalf("run %d: %+v", i, res)
		}
		l.Release()
	}
	use(0)
	use(1) // its last use: the replacement starts now
	// The worn-out container goes once its replacement is ready, not before, so the
	// sandbox always has a container.
	testenv.WaitFor(t, 60*time.Second, "the worn-out container to be retired", func() bool {
		return stats(p, "uses").Retired[sandboxpool.RetireMaxUses] == 1
	})
	use(2)
	if ids[0] != ids[1] || ids[1] == ids[2] {
		t.Errorf("container ids over three uses = %v, want the first used twice, then a new one", ids)
	}
	testenv.WaitFor(t, 30*time.Second, "the worn-out container should be removed from Docker", func() bool {
		return !slices.Contains(testenv.ContainersOf(t, workerOf(p)), ids[0])
	})
	if s := stats(p, "uses"); s.Total != 1 {
		t.Errorf("containers after recycling = %d, want 1", s.Total)
	}
}

func TestAWornOutContainerServesOnUntilItsReplacementIsReady(t *testing.T) {
	sb := sandbox(t, "worn", 1, 0)
	sb.MaxUses = 1
	p := newPool(t, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{sb}})
	first := checkout(t, p, "worn") // its only use: a replacement starts
	id := first.ContainerID()
	first.Release()
	// Until the replacement is ready, a caller is not kept waiting for a spawn.
	again := checkout(t, p, "worn")
	if again.ContainerID() != id && stats(p, "worn").Retired[sandboxpool.RetireMaxUses] == 0 {
		t.Errorf("got %s before any retirement, want the worn-out %s", again.ContainerID(), id)
	}
	again.Release()
	testenv.WaitFor(t, 60*time.Second, "the replacement to take over", func() bool {
		s := stats(p, "worn")
		return s.Retired[sandboxpool.RetireMaxUses] >= 1 && s.Idle == 1 && s.Total == 1
	})
	next := checkout(t, p, "worn")
	defer next.Release()
	if next.ContainerID() == id {
		t.Error("the worn-out container was lent after its replacement was ready")
	}
}

func TestAContainerKilledFromOutsideIsReplaced(t *testing.T) {
	p := newPool(t, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{sandbox(t, "kill", 1, 0)}})
	before := testenv.ContainersOf(t, workerOf(p))
	if len(before) != 1 {
		t.Fatalf("containers = %v, want 1", before)
	}
	if _, err := docker(t).ContainerKill(context.Background(), before[0], client.ContainerKillOptions{Signal: "KILL"}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 60*time.Second, "a new warm container should replace the killed one", func() bool {
		s := stats(p, "kill")
		ids := testenv.ContainersOf(t, workerOf(p))
		return s.Idle == 1 && len(ids) == 1 && ids[0] != before[0]
	})
	if got := stats(p, "kill").Retired[sandboxpool.RetireExited]; got != 1 {
		t.Errorf("retired as exited = %d, want 1", got)
	}
	l := checkout(t, p, "kill")
	defer l.Release()
	if res := run(t, l, "emit_result('alive')"); !res.Success {
		t.Errorf("run on the replacement: %+v", res)
	}
}

func TestCloseRemovesEveryContainerCheckedOutOrNot(t *testing.T) {
	docker(t)
	workerID := fmt.Sprintf("test-close-%d", time.Now().UnixNano())
	p, err := sandboxpool.New(sandboxpool.Config{Docker: docker(t), WorkerID: workerID, Sandboxes: []sandboxpool.Sandbox{sandbox(t, "close", 2, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	lease := checkout(t, p, "close")
	extra := checkout(t, p, "close")
	_ = checkout(t, p, "close") // overflow, never released
	if n := len(testenv.ContainersOf(t, workerID)); n != 3 {
		t.Fatalf("containers before Close = %d, want 3", n)
	}
	extra.Release()
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if left := testenv.ContainersOf(t, workerID); len(left) != 0 {
		t.Errorf("containers after Close: %v", left)
	}
	lease.Release() // after Close: nothing to do, no panic
	if _, err := p.Checkout(ctx, "close"); !errors.Is(err, sandboxpool.ErrClosed) {
		t.Errorf("checkout after Close: %v, want ErrClosed", err)
	}
	if err := p.Close(ctx); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestCheckoutErrors(t *testing.T) {
	bad := sandboxpool.Sandbox{Name: "bad", Image: "jazzmine-no-such-image:0", PoolSize: 0, MaxOverflow: 1}
	p := newPool(t, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{bad}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := p.Checkout(ctx, "nope"); !errors.Is(err, sandboxpool.ErrUnknownSandbox) {
		t.Errorf("unknown sandbox: err = %v, want ErrUnknownSandbox", err)
	}
	_, err := p.Checkout(ctx, "bad")
	if err == nil || !strings.Contains(err.Error(), "jazzmine-no-such-image") {
		t.Errorf("spawn from a missing image: err = %v, want it to name the image", err)
	}
	if s := stats(p, "bad"); s.Total != 0 || s.SpawnFailures != 1 {
		t.Errorf("after a failed spawn: %+v, want its slot released", s)
	}
}

func TestAContainerWithoutReadyIsRemoved(t *testing.T) {
	tools := t.TempDir()
	if err := os.WriteFile(filepath.Join(tools, "slow.py"), []byte("import time\ntime.sleep(600)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(tools, 0o755)
	sb := sandbox(t, "slow", 0, 1)
	sb.Mounts = []sandboxpool.Mount{{Source: tools, Target: "/tools", ReadOnly: true}}
	sb.ReadyTimeout = 2 * time.Second
	p := newPool(t, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{sb}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err := p.Checkout(ctx, "slow")
	if err == nil || !strings.Contains(err.Error(), "no ready line") {
		t.Fatalf("err = %v, want a ready timeout", err)
	}
	testenv.WaitFor(t, 30*time.Second, "the silent container should be removed", func() bool { return len(testenv.ContainersOf(t, workerOf(p))) == 0 })
}

func TestSecretsAndTranslatedMounts(t *testing.T) {
	hostRoot := t.TempDir()
	if err := os.MkdirAll(filepath.Join(hostRoot, "data", "set"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hostRoot, "data", "set", "hello.txt"), []byte("from the host"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(hostRoot, 0o755)
	sb := sandbox(t, "sec", 1, 0)
	sb.Secrets = []string{"FROM_MAP", "FROM_ENV", "NOWHERE"}
	sb.Env = map[string]string{"PLAIN": "p"}
	// The worker sees the data under /worker/view; Docker must be told the host path.
	sb.Mounts = []sandboxpool.Mount{{Source: "/worker/view/set", Target: "/data", ReadOnly: true}}
	p := newPool(t, sandboxpool.Config{
		Sandboxes: []sandboxpool.Sandbox{sb},
		Secrets:   map[string]string{"FROM_MAP": "m"},
		LookupEnv: func(k string) (string, bool) {
			return map[string]string{"FROM_ENV": "e", "FROM_MAP": "wrong"}[k], k == "FROM_ENV" || k == "FROM_MAP"
		},
		HostPathMap: map[string]string{"/worker": "/elsewhere", "/worker/view": filepath.Join(hostRoot, "data")},
	})
	l := checkout(t, p, "sec")
	defer l.Release()
	res := run(t, l, "import os\nemit_result([os.environ.get(k) for k in ('FROM_MAP', 'FROM_ENV', 'NOWHERE', 'PLAIN')] + [open('/data/hello.txt').read()])")
	if string(res.FinalData) != `["m","e",null,"p","from the host"]` {
		t.Errorf("secrets, env and mount seen by the script: %s %s", res.FinalData, res.Error)
	}
}

// TestAWorkerMustStayDeadForTheGraceBeforeItsContainersGo: a worker whose liveness
// lapsed and came back (cut off from NATS for a while) keeps its containers; one
// found dead in every check for the grace loses them.
func TestAWorkerMustStayDeadForTheGraceBeforeItsContainersGo(t *testing.T) {
	id := fmt.Sprintf("cutoff-%d", time.Now().UnixNano())
	created, err := docker(t).ContainerCreate(context.Background(), client.ContainerCreateOptions{
		Config: &container.Config{Image: testImage(t), Labels: map[string]string{
			sandboxpool.LabelManaged: "true", sandboxpool.LabelWorker: id, sandboxpool.LabelSandbox: "o"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		docker(t).ContainerRemove(context.Background(), created.ID, client.ContainerRemoveOptions{Force: true})
	})
	var alive atomic.Bool
	p := newPool(t, sandboxpool.Config{
		ReapMinAge:  time.Nanosecond,
		ReapGrace:   500 * time.Millisecond,
		WorkerAlive: func(_ context.Context, w string) (bool, error) { return w != id || alive.Load(), nil },
	})
	reap := func() int {
		t.Helper()
		n, err := p.ReapOrphans(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// Found dead (Start's check and this one are the first of a run), then alive
	// again, then dead: each time the grace starts over, so nothing goes.
	if reap() != 0 {
		t.Fatal("reaped at the first check that found the worker dead")
	}
	alive.Store(true)
	reap()
	alive.Store(false)
	if reap() != 0 || len(testenv.ContainersOf(t, id)) != 1 {
		t.Fatal("reaped a worker that had come back, at its first check dead since")
	}
	testenv.WaitFor(t, 30*time.Second, "the container of a worker dead for the grace to go", func() bool {
		reap()
		return len(testenv.ContainersOf(t, id)) == 0
	})
}

func TestOrphansOfDeadWorkersAreReapedAndLiveWorkersAreNot(t *testing.T) {
	// What a worker killed with SIGKILL leaves behind: a managed container of its id.
	deadID := fmt.Sprintf("dead-%d", time.Now().UnixNano())
	created, err := docker(t).ContainerCreate(context.Background(), client.ContainerCreateOptions{
		Config: &container.Config{Image: testImage(t), Labels: map[string]string{
			sandboxpool.LabelManaged: "true", sandboxpool.LabelWorker: deadID, sandboxpool.LabelSandbox: "o"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		docker(t).ContainerRemove(context.Background(), created.ID, client.ContainerRemoveOptions{Force: true})
	})
	live := newPool(t, sandboxpool.Config{WorkerID: fmt.Sprintf("live-%d", time.Now().UnixNano()), Sandboxes: []sandboxpool.Sandbox{sandbox(t, "o", 1, 0)}})
	// A worker that may still be starting keeps its young containers. Only deadID
	// is dead: the reapers of this test must not touch the containers of tests that
	// run beside it, in this package or another.
	newPool(t, sandboxpool.Config{
		Sandboxes:   []sandboxpool.Sandbox{sandbox(t, "o", 0, 1)},
		WorkerAlive: func(_ context.Context, id string) (bool, error) { return id != deadID, nil },
	})
	if left := testenv.ContainersOf(t, deadID); len(left) != 1 {
		t.Fatalf("a container younger than ReapMinAge was reaped: %v left", left)
	}
	var mu sync.Mutex
	asked := map[string]bool{}
	newPool(t, sandboxpool.Config{
		Sandboxes:  []sandboxpool.Sandbox{sandbox(t, "o", 0, 1)},
		ReapMinAge: time.Nanosecond,
		ReapGrace:  -1,
		WorkerAlive: func(_ context.Context, id string) (bool, error) {
			mu.Lock()
			defer mu.Unlock()
			asked[id] = true
			return id != deadID, nil
		},
	})
	if left := testenv.ContainersOf(t, deadID); len(left) != 0 {
		t.Errorf("the dead worker's container survived: %v", left)
	}
	if n := len(testenv.ContainersOf(t, live.WorkerID())); n != 1 {
		t.Errorf("the live worker has %d containers, want its 1", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if !asked[deadID] || !asked[live.WorkerID()] {
		t.Errorf("workers asked about: %v", asked)
	}
}

func TestIdleOverflowContainersGoAfterTheIdleTimeout(t *testing.T) {
	sb := sandbox(t, "idle", 1, 1)
	sb.IdleTimeout = 500 * time.Millisecond
	p := newPool(t, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{sb}})
	a, b := checkout(t, p, "idle"), checkout(t, p, "idle") // the second is overflow
	a.Release()
	b.Release()
	testenv.WaitFor(t, 30*time.Second, "the pool to shrink back to its size", func() bool {
		s := stats(p, "idle")
		return s.Total == 1 && s.Idle == 1 && s.Retired[sandboxpool.RetireIdle] == 1
	})
	testenv.WaitFor(t, 30*time.Second, "the idle container to leave Docker", func() bool { return len(testenv.ContainersOf(t, workerOf(p))) == 1 })
}

func TestAnIdleContainerThatStopsAnsweringIsReplaced(t *testing.T) {
	p := newPool(t, sandboxpool.Config{
		Sandboxes:      []sandboxpool.Sandbox{sandbox(t, "health", 1, 0)},
		HealthInterval: 200 * time.Millisecond,
		ResetTimeout:   2 * time.Second,
	})
	before := testenv.ContainersOf(t, workerOf(p))
	// A paused container keeps its stream open but answers nothing.
	if _, err := docker(t).ContainerPause(context.Background(), before[0], client.ContainerPauseOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 60*time.Second, "the silent container to be replaced", func() bool {
		s := stats(p, "health")
		ids := testenv.ContainersOf(t, workerOf(p))
		return s.Retired[sandboxpool.RetireUnhealthy] >= 1 && s.Idle == 1 && len(ids) == 1 && ids[0] != before[0]
	})
}

// TestReadySaysWhatTheSandboxLoaded: once a container is ready, the pool tells what its
// harness loaded (the example tools with their signatures and docstrings), and wakes
// whoever waited for it; before that, and for a sandbox it lacks, it knows nothing.
func TestReadySaysWhatTheSandboxLoaded(t *testing.T) {
	workerID := fmt.Sprintf("test-ready-%d", time.Now().UnixNano())
	p, err := sandboxpool.New(sandboxpool.Config{Docker: docker(t), WorkerID: workerID, Sandboxes: []sandboxpool.Sandbox{sandbox(t, "tools", 1, 0)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := p.Close(ctx); err != nil {
			t.Errorf("close pool: %v", err)
		}
	})
	changed := p.ReadyChanged()
	if _, ok := p.Ready("tools"); ok {
		t.Fatal("Ready before any container started")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	default:
		t.Error("ReadyChanged's channel is still open after the first container became ready")
	}
	r, ok := p.Ready("tools")
	if !ok || r.Version != harness.Version || r.Python == "" {
		t.Fatalf("Ready = %+v, %v", r, ok)
	}
	want := harness.ToolSpec{Name: "top_words", Signature: "(text: str, n: int = 3) -> list[dict]",
		Doc: "Returns the n most frequent words of text (lower-cased) with their counts."}
	if !slices.Contains(r.ToolSpecs, want) {
		t.Errorf("tool specs %+v lack %+v", r.ToolSpecs, want)
	}
	if i := slices.IndexFunc(r.ToolSpecs, func(s harness.ToolSpec) bool { return s.Name == "fetch_profile" }); i < 0 || !r.ToolSpecs[i].Async {
		t.Errorf("tool specs %+v lack the async fetch_profile", r.ToolSpecs)
	}
	if _, ok := p.Ready("nope"); ok {
		t.Error("Ready of a sandbox the pool does not have")
	}
}
