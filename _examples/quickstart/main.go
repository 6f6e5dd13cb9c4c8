// Command quickstart is the first program of the README: 5 requests a
// minute per client IP, counted in the Redis at REDIS_URL, or in an
// embedded one when it is unset. Run it with
//
//	go run ./_examples/quickstart
//
// The README shows this file from "package main" on: change the two
// together (CI's docs step, .ci/steps/25-docs.sh, compares them).
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/nethttp"
)

func main() {
	// Redis: REDIS_URL (redis://127.0.0.1:6379/0), else an embedded one.
	url, opt := os.Getenv("REDIS_URL"), &redis.Options{}
	if url != "" {
		var err error
		if opt, err = redis.ParseURL(url); err != nil {
			log.Fatalf("REDIS_URL (write redis://host:port/db): %v", err)
		}
	} else {
		m, err := miniredis.Run()
		if err != nil {
			log.Fatal(err)
		}
		opt.Addr = m.Addr()
	}

	// One Limiter per process, shared by every rule.
	l, err := core.New(redis.NewClient(opt))
	if err != nil {
		log.Fatal(err)
	}
	// Stop here unless Redis answers, takes the password, runs the scripts
	// and will not evict the limiter's keys: otherwise every request would
	// pass unlimited (the failure mode, FailOpen, answers). The embedded
	// Redis cannot tell its eviction policy (ErrCheckIncomplete).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := l.Check(ctx); err != nil && !(url == "" && errors.Is(err, core.ErrCheckIncomplete)) {
		log.Fatalf("redis: %v", err)
	}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	})
	// 5 requests a minute per client IP; the 6th gets 429 and Retry-After.
	handler := nethttp.LimitByIP(l, 5, time.Minute)(mux)

	ln, err := net.Listen("tcp", cmp.Or(os.Getenv("ADDR"), "127.0.0.1:8080"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("listening on http://" + ln.Addr().String())
	log.Fatal(http.Serve(ln, handler))
}
