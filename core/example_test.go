package core_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core"
)

func ExampleLimiter_Allow() {
	ctx := context.Background()
	// NewMemory keeps counts in this process; use core.New(redisClient) to
	// share them across replicas.
	l := core.NewMemory()
	perSecond := core.PerSecond(2)
	perHour := core.PerHour(100).With(core.SlidingCounter)

	for i := 0; i < 3; i++ {
		r, err := l.Allow(ctx, "user:42", perSecond, perHour)
		if err != nil {
			panic(err)
		}
		fmt.Println(r.Allowed, r.Remaining, r.Limit)
	}
	// Output:
	// true 1 2 per 1s (sliding-log)
	// true 0 2 per 1s (sliding-log)
	// false 0 2 per 1s (sliding-log)
}

func ExampleLimiter_AllowN() {
	ctx := context.Background()
	l := core.NewMemory()
	limit := core.PerMinute(10)

	r, _ := l.AllowN(ctx, "export", 8, limit)
	fmt.Println(r.Allowed, r.Remaining)
	r, _ = l.AllowN(ctx, "export", 3, limit)
	fmt.Println(r.Allowed, r.Remaining)
	r, _ = l.AllowN(ctx, "export", 11, limit) // can never fit
	fmt.Println(r.Allowed, r.Never())
	// Output:
	// true 2
	// false 2
	// false true
}

func ExampleLimiter_Peek() {
	ctx := context.Background()
	l := core.NewMemory()
	limit := core.PerMinute(5)
	l.Allow(ctx, "k", limit)
	r, _ := l.Peek(ctx, "k", limit)
	fmt.Println(r.Allowed, r.Remaining)
	// Output: true 4
}

func ExampleLimiter_Wait() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l := core.NewMemory()
	limit := core.Per(2, 100*time.Millisecond)

	start := time.Now()
	for i := 0; i < 4; i++ {
		if err := l.Wait(ctx, "third-party-api", limit); err != nil {
			panic(err)
		}
	}
	// two go at once, two wait for the window to slide
	fmt.Println(time.Since(start) >= 100*time.Millisecond)
	// Output: true
}

func ExampleLimit_String() {
	fmt.Println(core.PerMinute(100))
	fmt.Println(core.Limit{Count: 5, Window: time.Hour, Algorithm: core.SlidingBuckets, Precision: time.Minute}.PolicyName())
	// Output:
	// 100 per 1m0s (sliding-log)
	// 5-per-1h
}

// A Redis failure is answered by the failure mode, and that answer is a
// decision: the error is nil, and Result.BackendErr says what failed. Log
// it, and branch on Allowed, as when Redis answers.
func ExampleResult_BackendErr() {
	ctx := context.Background()
	// a Redis that is down: nothing listens on this loopback port
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer rdb.Close()
	l, err := core.New(rdb) // FailOpen, the default
	if err != nil {
		panic(err)
	}

	r, err := l.Allow(ctx, "user:42", core.PerMinute(10))
	if err != nil { // no decision: bad input, or ctx ended
		panic(err)
	}
	if r.BackendErr != nil {
		fmt.Println("redis failed; the failure mode answered") // log r.BackendErr
	}
	fmt.Println("allowed:", r.Allowed)
	// Output:
	// redis failed; the failure mode answered
	// allowed: true
}

func ExampleParseLimits() {
	limits, err := core.ParseLimits("10/s, 1000/h") // from configuration
	if err != nil {
		panic(err)
	}
	for _, l := range limits {
		fmt.Println(l)
	}
	_, err = core.ParseLimits("10/x")
	fmt.Println(err)
	// Output:
	// 10 per 1s (sliding-log)
	// 1000 per 1h0m0s (sliding-log)
	// ratewindow: invalid limit: item 1 of "10/x": window "x" in "10/x": want a unit (ms, s, m, h, d) or a duration such as 15m
}

func ExampleLimiter_Check() {
	ctx := context.Background()
	// core.New(rdb): Check pings every master, runs a script on the
	// Limiter's keys and reads the eviction policy. Call it at start-up and
	// in readiness probes.
	l := core.NewMemory()
	if err := l.Check(ctx); err != nil {
		fmt.Println("not ready:", err)
		return
	}
	fmt.Println("ready")
	// Output: ready
}

func ExampleLimiter_Refund() {
	ctx := context.Background()
	l := core.NewMemory()
	attempts := core.PerMinute(3)
	for range 3 {
		_, _ = l.Allow(ctx, "login:alice", attempts)
	}
	// the third attempt succeeded: forget the failed ones
	_ = l.Refund(ctx, "login:alice", 3, attempts)
	r, _ := l.Peek(ctx, "login:alice", attempts)
	fmt.Println(r.Allowed, r.Remaining)
	// Output: true 3
}

// Count failed logins only, and ban a client that keeps failing.
func ExampleRule_countIf() {
	l := core.NewMemory()
	e, err := core.NewEnforcer(l, core.Rule{
		Name:    "login",
		Limits:  []core.Limit{core.PerMinute(2)},
		CountIf: func(status int) bool { return status == http.StatusUnauthorized },
		Penalty: &core.Penalty{Denials: 2, Within: time.Minute, Ban: time.Hour},
	})
	if err != nil {
		panic(err)
	}
	login := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Password") != "letmein" {
			w.WriteHeader(http.StatusUnauthorized)
		}
	})
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r, ok := e.Handle(w, r, ""); ok {
			e.ServeNext(w, r, login) // what every adapter does
		}
	})
	for _, password := range []string{"letmein", "letmein", "letmein", "wrong", "wrong", "wrong", "wrong", "letmein"} {
		req := httptest.NewRequest(http.MethodPost, "/login", nil)
		req.Header.Set("X-Password", password)
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		line := fmt.Sprint(password, " ", rec.Code)
		if ra := rec.Header().Get("Retry-After"); ra != "" {
			line += " " + ra
		}
		fmt.Println(line)
	}
	// Output:
	// letmein 200
	// letmein 200
	// letmein 200
	// wrong 401
	// wrong 401
	// wrong 429 60
	// wrong 429 3600
	// letmein 429 3600
}

// Limits chosen per request, by the plan of the caller's API key.
func ExampleRule_limitsFor() {
	plans := map[string][]core.Limit{
		"free-key": {{Name: "free", Count: 1, Window: time.Minute}},
		"pro-key":  {{Name: "pro", Count: 100, Window: time.Minute}},
	}
	e, err := core.NewEnforcer(core.NewMemory(), core.Rule{
		Name:      "api",
		Limits:    []core.Limit{{Name: "anonymous", Count: 10, Window: time.Hour}},
		Key:       func(r *http.Request) (string, error) { return r.Header.Get("X-Api-Key"), nil },
		LimitsFor: func(r *http.Request) ([]core.Limit, error) { return plans[r.Header.Get("X-Api-Key")], nil },
		Headers:   core.IETF,
	})
	if err != nil {
		panic(err)
	}
	for _, key := range []string{"free-key", "pro-key", "other-key"} {
		req := httptest.NewRequest(http.MethodGet, "/orders", nil)
		req.Header.Set("X-Api-Key", key)
		rec := httptest.NewRecorder()
		e.Handle(rec, req, "")
		fmt.Println(key, rec.Header().Get("RateLimit"))
	}
	// Output:
	// free-key "free";r=0;t=60
	// pro-key "pro";r=99;t=60
	// other-key "anonymous";r=9;t=3600
}
