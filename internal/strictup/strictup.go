// Package strictup is the strict upstream and the client loop of the
// promises command's upstream scenario (internal/cmd/promises), shared by
// its HTTP half and grpcmw's gRPC half: an upstream that admits at most a
// number of requests in any 1s window by its own arrival times, as a
// strict third-party API does, and the processes' reports as JSON.
package strictup

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Log admits at most its limit of requests in any 1s window by their
// arrival times (a log of them), and refuses the others.
type Log struct {
	mu       sync.Mutex
	limit    int
	arrivals []time.Time // every request, refused or not
	admitted []time.Time
	refused  int
}

// New returns a Log that admits limit requests in any 1s window.
func New(limit int) *Log { return &Log{limit: limit} }

// Arrive records a request arriving at now and reports whether it is
// admitted: not when it would be the limit's next within 1s of the
// admitted ones (refused ones do not count); retry is then the time until
// it would have been.
func (l *Log) Arrive(now time.Time) (ok bool, retry time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.arrivals = append(l.arrivals, now)
	if n := len(l.admitted); n >= l.limit {
		if oldest := l.admitted[n-l.limit]; now.Sub(oldest) < time.Second {
			l.refused++
			return false, oldest.Add(time.Second).Sub(now)
		}
	}
	l.admitted = append(l.admitted, now)
	return true, 0
}

// RetryAfter is retry in whole seconds, rounded up, never 0: HTTP's
// Retry-After.
func RetryAfter(retry time.Duration) string {
	return strconv.FormatInt(int64(max((retry+time.Second-1)/time.Second, 1)), 10)
}

// Seen is what an upstream process reports: every arrival (Unix ns), the
// refusals, and the longest time its ticker (every 5ms) ran late, which
// would bunch arrivals that the clients spaced.
type Seen struct {
	Arrivals []int64
	Refused  int
	Stall    time.Duration
}

// Seen returns what l saw, with the longest stall.
func (l *Log) Seen(stall time.Duration) Seen {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := Seen{Refused: l.refused, Stall: stall}
	for _, t := range l.arrivals {
		s.Arrivals = append(s.Arrivals, t.UnixNano())
	}
	return s
}

// Serve runs an upstream process: it listens on a free port of 127.0.0.1
// and prints the address, serves with serve until SIGTERM (then it calls
// stop, which must end serve), and prints what l saw as JSON. serve's
// error is returned unless it is closed, as closed says.
func Serve(l *Log, serve func(net.Listener) error, stop func(), closed func(error) bool) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	var stall atomic.Int64
	done := make(chan struct{})
	go func() {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		last := time.Now()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				now := time.Now()
				if late := now.Sub(last) - 5*time.Millisecond; late > time.Duration(stall.Load()) {
					stall.Store(int64(late))
				}
				last = now
			}
		}
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	go func() {
		<-sig
		close(done)
		stop()
	}()
	fmt.Println(ln.Addr())
	if err := serve(ln); err != nil && !closed(err) {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(l.Seen(time.Duration(stall.Load())))
}

// Stats is what a client process reports.
type Stats struct {
	Sent, OK, Refused, Failed int64            // requests; Refused: a refusal reached the caller
	Took                      time.Duration    // all requests' time, Wait and trip
	Errors                    map[string]int64 `json:",omitempty"`
	Starts                    []int64          `json:",omitempty"` // ns since 1970 the throttler let each request go (retries too)
}

// Starts records the times the throttler lets requests go, for a
// client's Stats: call Go where a request leaves the throttler.
type Starts struct {
	mu sync.Mutex
	ns []int64
}

// Go records a start now.
func (s *Starts) Go() {
	now := time.Now().UnixNano()
	s.mu.Lock()
	s.ns = append(s.ns, now)
	s.mu.Unlock()
}

// Times returns the starts recorded.
func (s *Starts) Times() []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.ns)
}

// Add adds o to s.
func (s *Stats) Add(o Stats) {
	s.Sent += o.Sent
	s.OK += o.OK
	s.Refused += o.Refused
	s.Failed += o.Failed
	s.Took += o.Took
	s.Starts = append(s.Starts, o.Starts...)
	for k, v := range o.Errors {
		if s.Errors == nil {
			s.Errors = map[string]int64{}
		}
		s.Errors[k] += v
	}
}

// Clients runs a client process's loop: from start (Unix ns, as text) on,
// goroutines goroutines call send in a loop for d (as text), and it prints
// their Stats as JSON. send reports a refusal that reached the caller, or
// the request's error.
func Clients(start, goroutines, d string, starts *Starts, send func() (refused bool, err error)) error {
	startNS, err := strconv.ParseInt(start, 10, 64)
	if err != nil {
		return fmt.Errorf("start: %w", err)
	}
	n, err := strconv.Atoi(goroutines)
	if err != nil || n < 1 {
		return errors.Join(errors.New("goroutines must be a positive number"), err)
	}
	dur, err := time.ParseDuration(d)
	if err != nil {
		return err
	}
	var sent, ok, refused, failed, took atomic.Int64
	var errs sync.Map
	time.Sleep(time.Until(time.Unix(0, startNS)))
	end := time.Now().Add(dur)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for time.Now().Before(end) {
				t0 := time.Now()
				no, err := send()
				took.Add(int64(time.Since(t0)))
				sent.Add(1)
				switch {
				case err != nil:
					failed.Add(1)
					c, _ := errs.LoadOrStore(err.Error(), new(atomic.Int64))
					c.(*atomic.Int64).Add(1)
					time.Sleep(10 * time.Millisecond)
				case no:
					refused.Add(1)
				default:
					ok.Add(1)
				}
			}
		})
	}
	wg.Wait()
	st := Stats{Sent: sent.Load(), OK: ok.Load(), Refused: refused.Load(), Failed: failed.Load(), Took: time.Duration(took.Load()), Starts: starts.Times()}
	errs.Range(func(k, v any) bool {
		if st.Errors == nil {
			st.Errors = map[string]int64{}
		}
		st.Errors[k.(string)] = v.(*atomic.Int64).Load()
		return true
	})
	return json.NewEncoder(os.Stdout).Encode(st)
}
