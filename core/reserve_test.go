package core

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/internal/redistest"
)

// slowReplies is a TCP proxy on loopback that passes commands to Redis at
// once and holds every reply for delay: the script runs, and its reply
// arrives after the caller has given up.
func slowReplies(t *testing.T, target string, delay time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			wg.Add(2)
			go func() { // commands: at once
				defer wg.Done()
				_, _ = io.Copy(server, client)
				server.Close()
			}()
			go func() { // replies: each chunk after delay
				defer wg.Done()
				defer client.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := server.Read(buf)
					if n > 0 {
						time.Sleep(delay)
						if _, werr := client.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
			go func() { <-ctxDone(t); client.Close(); server.Close() }()
		}
	}()
	return ln.Addr().String()
}

// ctxDone is closed when t's test ends.
func ctxDone(t *testing.T) <-chan struct{} {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx.Done()
}

// TestWaitCancelledBeforeReplyReleases: the caller's context ends while the
// reservation's reply is on its way (Redis answers in 200ms, the caller
// gives up at 100ms). The script has run; the reservation must be given
// back once the reply arrives, with a default go-redis client and with
// ContextTimeoutEnabled.
func TestWaitCancelledBeforeReplyReleases(t *testing.T) {
	t.Parallel()
	for _, cte := range []bool{false, true} {
		name := "default client"
		if cte {
			name = "ContextTimeoutEnabled"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t) // its own server: its script counts are this test's
			direct := srv.Client(t)
			proxy := slowReplies(t, direct.Options().Addr, 200*time.Millisecond)
			rdb := redis.NewClient(&redis.Options{Addr: proxy, ContextTimeoutEnabled: cte})
			t.Cleanup(func() { rdb.Close() })
			prefix := uniquePrefix(t)
			l, err := New(rdb, WithPrefix(prefix))
			if err != nil {
				t.Fatal(err)
			}
			lim := PerMinute(5)
			key := storageKey(keyTag(prefix, "k"), lim)
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			if err := l.Wait(ctx, "k", lim); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Wait: %v, want the caller's deadline", err)
			}
			// the reservation ran (one script), then its release (a second
			// one), and the log is empty again
			bg := context.Background()
			var runs, units int64
			eventually(t, "the reservation given back", func() bool {
				runs = scriptRuns(t, direct)
				n, err := storedLogLen(bg, direct, key)
				if err != nil {
					t.Fatal(err)
				}
				units = n
				return runs == 2 && units == 0
			})
		})
	}
}

// scriptRuns is the number of scripts the server has run: EVAL and
// EVALSHA calls, less those that failed (NOSCRIPT before the EVAL that
// sends the script's source).
func scriptRuns(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, line := range strings.Split(info, "\n") {
		name, stats, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "cmdstat_eval" && name != "cmdstat_evalsha" && name != "cmdstat_fcall") {
			continue
		}
		for _, field := range strings.Split(stats, ",") {
			k, v, _ := strings.Cut(field, "=")
			n, err := strconv.ParseInt(v, 10, 64)
			switch {
			case k != "calls" && k != "failed_calls":
			case err != nil:
				t.Fatalf("commandstats %q: %v", line, err)
			case k == "calls":
				total += n
			default:
				total -= n
			}
		}
	}
	return total
}
