package redisenv

import (
	"context"
	"strings"
	"testing"
)

func TestOpen(t *testing.T) {
	t.Setenv("REDIS_URL", "")
	rdb, embedded, closeRedis, err := Open()
	if err != nil || !embedded {
		t.Fatalf("embedded: %v %v", embedded, err)
	}
	defer closeRedis()
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	t.Setenv("REDIS_URL", "redis://user:secret@127.0.0.1:x/0")
	if _, _, _, err := Open(); err == nil || strings.Contains(err.Error(), "secret") {
		t.Fatalf("a bad REDIS_URL: %v, want an error without the password", err)
	}
}

func TestOpenHint(t *testing.T) {
	for _, c := range []struct{ env, want string }{
		{"127.0.0.1:6379", "REDIS_URL is not a URL: write redis://127.0.0.1:6379/0 (rediss:// for TLS)"},
		{"localhost:6380", "REDIS_URL is not a URL: write redis://localhost:6380/0 (rediss:// for TLS)"},
		{":6379", "REDIS_URL is not a URL: write redis://127.0.0.1:6379/0 (rediss:// for TLS)"},
		{"[::1]:6379", "REDIS_URL is not a URL: write redis://[::1]:6379/0 (rediss:// for TLS)"},
		{"user:secret@127.0.0.1:6379", "REDIS_URL is not a URL: write redis://HOST:PORT/DB, such as redis://127.0.0.1:6379/0 (rediss:// for TLS)"},
		{"redis-host", "REDIS_URL is not a URL: write redis://HOST:PORT/DB, such as redis://127.0.0.1:6379/0 (rediss:// for TLS)"},
	} {
		t.Setenv("REDIS_URL", c.env)
		_, _, _, err := Open()
		if err == nil || err.Error() != c.want {
			t.Errorf("REDIS_URL=%q: %v, want %q", c.env, err, c.want)
		}
	}
}

func TestAddr(t *testing.T) {
	for _, c := range []struct{ env, want string }{
		{"", "127.0.0.1:8080"}, {"9090", "127.0.0.1:9090"}, {":8080", ":8080"}, {"[::1]:0", "[::1]:0"},
	} {
		t.Setenv("ADDR", c.env)
		if got := Addr(); got != c.want {
			t.Errorf("ADDR=%q: %q, want %q", c.env, got, c.want)
		}
	}
}
