package bench

import (
	"encoding/json"
	"math/bits"
	"time"
)

// hist is a log-linear latency histogram: 32 sub-buckets per power of two,
// so a percentile is within about 3% of the true value. It allocates
// nothing when recording; each goroutine has its own.
type hist struct {
	counts [histBuckets]uint32
	n      uint64
}

const (
	histSub     = 32
	histBuckets = 60 * histSub // up to 2^64 ns
)

func histIndex(ns uint64) int {
	if ns < histSub {
		return int(ns)
	}
	e := bits.Len64(ns) - 6 // ns >> e is in [32, 64)
	return (e+1)*histSub + int(ns>>uint(e)) - histSub
}

// histValue is the upper bound in ns of bucket i.
func histValue(i int) uint64 {
	if i < histSub {
		return uint64(i)
	}
	e := i/histSub - 1
	m := uint64(i%histSub + histSub)
	return (m+1)<<uint(e) - 1
}

func (h *hist) record(d time.Duration) {
	if d < 0 {
		d = 0
	}
	h.counts[histIndex(uint64(d))]++
	h.n++
}

func (h *hist) merge(o *hist) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
}

// quantile returns the latency at q in [0, 1].
func (h *hist) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	target := uint64(q*float64(h.n-1)) + 1
	var seen uint64
	for i, c := range h.counts {
		seen += uint64(c)
		if seen >= target {
			return time.Duration(histValue(i))
		}
	}
	return time.Duration(histValue(len(h.counts) - 1))
}

// MarshalJSON writes h for another process (the flood's children).
func (h *hist) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Counts []uint32
		N      uint64
	}{h.counts[:], h.n})
}

// UnmarshalJSON reads what MarshalJSON wrote.
func (h *hist) UnmarshalJSON(b []byte) error {
	var v struct {
		Counts []uint32
		N      uint64
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	copy(h.counts[:], v.Counts)
	h.n = v.N
	return nil
}
