package main

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ratewindow/ratewindow/internal/redistest"
)

// freeAddr returns a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

func TestWrongAddress(t *testing.T) {
	addr := freeAddr(t)
	for _, url := range []string{"redis://" + addr, "redis://" + addr + "?addr=" + freeAddr(t)} {
		_, errOut, code := runTool(t, url, "", "rules")
		if code != exitFail || !strings.Contains(errOut, "cannot reach Redis") || !strings.Contains(errOut, addr) || !strings.Contains(errOut, "connection refused") {
			t.Errorf("REDIS_URL=%s: exit %d, %q", url, code, errOut)
		}
	}
}

func TestWrongPassword(t *testing.T) {
	const password = "s3cret-pw"
	// A dedicated server, its password set once it has started (Start's
	// readiness check has none).
	p := redistest.Start(t)
	if err := p.Client(t).ConfigSet(context.Background(), "requirepass", password).Err(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ url, want string }{
		{"redis://:wrong-pw@" + p.Addr, "WRONGPASS"},
		{"redis://" + p.Addr, "NOAUTH"},
		{"redis://nobody:" + password + "@" + p.Addr, "WRONGPASS"},
	} {
		_, errOut, code := runTool(t, c.url, "", "rules")
		if code != exitFail || !strings.Contains(errOut, "refused the credentials in REDIS_URL") || !strings.Contains(errOut, c.want) {
			t.Errorf("REDIS_URL=%s: exit %d, %q", c.url, code, errOut)
		}
		if strings.Contains(errOut, "wrong-pw") || strings.Contains(errOut, password) {
			t.Errorf("the error shows the password: %q", errOut)
		}
	}
	out, errOut, code := runTool(t, "redis://:"+password+"@"+p.Addr, "", "rules")
	if code != exitOK || !strings.Contains(out, "no rule is published") {
		t.Errorf("the right password: exit %d, %q %q", code, out, errOut)
	}
}

func TestBadURL(t *testing.T) {
	for _, c := range []struct{ url, want string }{
		{"", "REDIS_URL is not set"},
		{"http://127.0.0.1:6379", "invalid URL scheme"},
		{"redis://user:pass word@127.0.0.1:%zz", "REDIS_URL is not a URL"},
		{"redis://127.0.0.1:6379/x", "invalid database number"},
		{"redis://127.0.0.1:6379?colour=blue", "unexpected option"},
	} {
		_, errOut, code := runTool(t, c.url, "", "rules")
		if code != exitFail || !strings.Contains(errOut, c.want) || !strings.Contains(errOut, "rediss://") {
			t.Errorf("REDIS_URL=%q: exit %d, %q", c.url, code, errOut)
		}
		if strings.Contains(errOut, "pass word") {
			t.Errorf("the error shows the password: %q", errOut)
		}
	}
}

func TestClusterFromOneNode(t *testing.T) {
	c := redistest.NewCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rdb, err := connect(ctx, "redis://"+c.Addrs[0])
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rdb.Close() }()
	// Keys in every slot range: a client of one node would get MOVED.
	for i := range 30 {
		if err := rdb.Set(ctx, "rwcli:cluster:"+string(rune('a'+i)), i, time.Minute).Err(); err != nil {
			t.Fatalf("a node's address did not give a Cluster client: %v", err)
		}
	}
	_, errOut, code := runTool(t, "redis://"+c.Addrs[0]+"/2", "", "rules")
	if code != exitFail || !strings.Contains(errOut, "database 0 only") {
		t.Errorf("a Cluster node with a database: exit %d, %q", code, errOut)
	}
}
