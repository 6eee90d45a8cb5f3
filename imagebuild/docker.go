package imagebuild

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/moby/moby/client"
)

// Docker is the part of the Docker Engine API the builder uses. *client.Client
// implements it; tests use fakes.
type Docker interface {
	ImageInspect(ctx context.Context, ref string, opts ...client.ImageInspectOption) (client.ImageInspectResult, error)
	ImageBuild(ctx context.Context, buildContext io.Reader, options client.ImageBuildOptions) (client.ImageBuildResult, error)
}

var _ Docker = (*client.Client)(nil)

// probeTimeout bounds the direct dial Connect makes to find out why a ping failed.
const probeTimeout = 5 * time.Second

// Connect returns a client of the Docker engine the environment names
// (DOCKER_HOST, DOCKER_API_VERSION, DOCKER_CERT_PATH, DOCKER_TLS_VERIFY; the
// local socket when unset), after a ping that also negotiates the API version.
// When the engine cannot be reached, the error says what to fix: a missing
// socket (Docker not running, or not mounted into this container), a socket the
// user may not open, or a TCP host that refuses or does not answer. The caller
// closes the client.
func Connect(ctx context.Context) (*client.Client, error) {
	cli, err := client.New(client.FromEnv)
	if err != nil {
		return nil, fmt.Errorf("docker client (check DOCKER_HOST and the DOCKER_* variables): %w", err)
	}
	if _, err := cli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true}); err != nil {
		host := cli.DaemonHost()
		_ = cli.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("ping Docker at %s: %w", host, err)
		}
		// The SDK reports most connection failures without their cause; dial the
		// daemon's address directly to learn it.
		if dialErr := dialDaemon(ctx, host); dialErr != nil {
			err = dialErr
		}
		return nil, explainDockerError(host, err)
	}
	return cli, nil
}

// dialDaemon connects to a Docker host's unix socket or TCP address and returns
// why that fails, or nil (also for transports it does not probe).
func dialDaemon(ctx context.Context, host string) error {
	u, err := client.ParseHostURL(host)
	if err != nil {
		return err
	}
	network, addr := u.Scheme, u.Host // a unix socket's path is in Host
	switch network {
	case "unix":
	case "tcp", "http", "https":
		network = "tcp"
	default:
		return nil
	}
	d := net.Dialer{Timeout: probeTimeout}
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return err
	}
	_ = conn.Close()
	return nil
}

// explainDockerError turns a failure to reach the Docker engine at host into an
// error that says what to do about it; it wraps err.
func explainDockerError(host string, err error) error {
	socket := ""
	if u, perr := client.ParseHostURL(host); perr == nil && u.Scheme == "unix" {
		socket = u.Host // ParseHostURL keeps a socket's path in Host
	}
	var netErr net.Error
	var dnsErr *net.DNSError
	switch {
	case socket != "" && errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%s does not exist: is Docker running? inside a container, mount the host's socket with -v /var/run/docker.sock:%s (or set DOCKER_HOST): %w",
			socket, socket, err)
	case errors.Is(err, os.ErrPermission):
		where := host
		if socket != "" {
			where = socket
		}
		return fmt.Errorf("permission denied on %s: add the user to the docker group or run as root: %w", where, err)
	case socket != "" && errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("%s refuses connections: the Docker daemon is not running (the socket is stale): %w", socket, err)
	case socket == "" && errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("the Docker engine at %s refuses connections: is the daemon listening there? check DOCKER_HOST: %w", host, err)
	case errors.As(err, &dnsErr):
		return fmt.Errorf("the Docker host %s cannot be resolved: check DOCKER_HOST: %w", host, err)
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH),
		errors.As(err, &netErr) && netErr.Timeout():
		return fmt.Errorf("the Docker engine at %s is unreachable: check DOCKER_HOST and the network or firewall between here and it: %w", host, err)
	default:
		return fmt.Errorf("cannot use Docker at %s (DOCKER_HOST): %w", host, err)
	}
}
