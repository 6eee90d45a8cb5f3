package worker

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestReadinessFailsNamingEachCheckUntilAllPass(t *testing.T) {
	var h Health
	warm, connected := errors.New("warming up"), errors.New("disconnected")
	h.Check("pools", func() error { return warm })
	h.Check("nats", func() error { return connected })
	srv := httptest.NewServer(h.Handler(http.NotFoundHandler()))
	defer srv.Close()
	probe := func(path string) (int, string) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		buf := make([]byte, 512)
		n, _ := resp.Body.Read(buf)
		b.Write(buf[:n])
		return resp.StatusCode, b.String()
	}
	if code, body := probe("/readyz"); code != 503 || !strings.Contains(body, "pools: warming up") || !strings.Contains(body, "nats: disconnected") {
		t.Errorf("/readyz with two failing checks = %d %q", code, body)
	}
	warm = nil
	if code, body := probe("/readyz"); code != 503 || strings.Contains(body, "pools") {
		t.Errorf("/readyz with one failing check = %d %q", code, body)
	}
	connected = nil
	if code, _ := probe("/readyz"); code != 200 {
		t.Errorf("/readyz with all checks passing = %d", code)
	}
	if code, _ := probe("/healthz"); code != 200 {
		t.Errorf("/healthz = %d", code)
	}
}
