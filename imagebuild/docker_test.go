package imagebuild

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func dialError(network string, errno syscall.Errno) error {
	return &net.OpError{Op: "dial", Net: network, Err: &os.SyscallError{Syscall: "connect", Err: errno}}
}

type timeoutError struct{}

func (timeoutError) Error() string   { return "i/o timeout" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

func TestExplainDockerError(t *testing.T) {
	const sock = "unix:///var/run/docker.sock"
	tests := []struct {
		name string
		host string
		err  error
		want []string
	}{
		{"a missing socket asks whether Docker runs and how to mount it", sock, dialError("unix", syscall.ENOENT),
			[]string{"/var/run/docker.sock does not exist: is Docker running?", "-v /var/run/docker.sock:/var/run/docker.sock"}},
		{"a socket the user may not open asks for the docker group", sock, dialError("unix", syscall.EACCES),
			[]string{"permission denied on /var/run/docker.sock", "add the user to the docker group or run as root"}},
		{"a stale socket says the daemon is not running", "unix:///tmp/d.sock", dialError("unix", syscall.ECONNREFUSED),
			[]string{"/tmp/d.sock refuses connections", "not running"}},
		{"a refused TCP host asks to check DOCKER_HOST", "tcp://10.0.0.5:2375", dialError("tcp", syscall.ECONNREFUSED),
			[]string{"tcp://10.0.0.5:2375 refuses connections", "DOCKER_HOST"}},
		{"an unreachable TCP host asks to check the network", "tcp://10.0.0.5:2375", dialError("tcp", syscall.EHOSTUNREACH),
			[]string{"tcp://10.0.0.5:2375 is unreachable", "DOCKER_HOST"}},
		{"a TCP host that does not answer is unreachable", "tcp://10.0.0.5:2375", &net.OpError{Op: "dial", Net: "tcp", Err: timeoutError{}},
			[]string{"is unreachable"}},
		{"an unknown TCP host name cannot be resolved", "tcp://nope.invalid:2375", &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "nope.invalid", IsNotFound: true}},
			[]string{"nope.invalid:2375 cannot be resolved"}},
		{"anything else names the host", sock, errors.New("tls: bad certificate"),
			[]string{"cannot use Docker at unix:///var/run/docker.sock", "tls: bad certificate"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := explainDockerError(tt.host, tt.err)
			if !errors.Is(got, tt.err) {
				t.Errorf("%v does not wrap the cause", got)
			}
			for _, w := range tt.want {
				if !strings.Contains(got.Error(), w) {
					t.Errorf("%q lacks %q", got, w)
				}
			}
		})
	}
}

func TestConnectToAMissingSocketSaysWhatToFix(t *testing.T) {
	path := filepath.Join(t.TempDir(), "docker.sock")
	t.Setenv("DOCKER_HOST", "unix://"+path)
	_, err := Connect(context.Background())
	if err == nil || !strings.Contains(err.Error(), path+" does not exist: is Docker running?") {
		t.Fatalf("Connect: %v", err)
	}
}

func TestConnectToAStaleSocketSaysTheDaemonIsNotRunning(t *testing.T) {
	path := filepath.Join(t.TempDir(), "docker.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	t.Setenv("DOCKER_HOST", "unix://"+path)
	_, err = Connect(context.Background())
	if err == nil || !strings.Contains(err.Error(), "refuses connections") || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("Connect: %v", err)
	}
}

func TestConnectToAClosedTCPPortSaysItRefuses(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	t.Setenv("DOCKER_HOST", "tcp://"+addr)
	_, err = Connect(context.Background())
	if err == nil || !strings.Contains(err.Error(), "tcp://"+addr+" refuses connections") {
		t.Fatalf("Connect: %v", err)
	}
}

func TestConnectToAnUnreadableSocketAsksForTheDockerGroup(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root opens any socket; the permission case is covered by TestExplainDockerError")
	}
	path := filepath.Join(t.TempDir(), "docker.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := os.Chmod(path, 0o000); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DOCKER_HOST", "unix://"+path)
	_, err = Connect(context.Background())
	if err == nil || !strings.Contains(err.Error(), "add the user to the docker group") {
		t.Fatalf("Connect: %v", err)
	}
}
