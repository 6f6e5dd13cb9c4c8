package redisstore

import (
	"strings"

	"github.com/ratewindow/ratewindow/core/internal/store"
)

// The names of a key's block key ("rw:{ip:203.0.113.9}:block", see
// Limiter.Block; it holds the key's override too) and penalty key; no
// limit's name is a word.
const (
	blockName   = "block"
	penaltyName = "penalty"
)

// keyFormat versions the layouts of the values in limit keys ("rw:{k}:v2:r1m"),
// so that two versions on one Redis (a rolling deploy) never read each
// other's (see docs/redis.md); the block and penalty keys stay, for all.
const keyFormat = "v2:"

// Which of a key's own keys appendKeys puts before its limits' keys.
const (
	withBlock   = 1 << iota // the block key
	withPenalty             // the penalty key, after it
)

// appendKeys appends to dst key's block and penalty keys as own says, then
// the storage key of every limit, such as "rw:{ip:203.0.113.9}:v2:r1m".
// The keys share one string: one allocation in all.
func appendKeys(dst []string, prefix, key string, limits []store.Limit, own int) []string {
	var tagBuf, buf [256]byte
	tag := appendTag(tagBuf[:0], prefix, key)
	b := buf[:0]
	var endsBuf [2 + store.MaxLimits]int // where each key ends in b
	ends := endsBuf[:0]
	for i, name := range [...]string{blockName, penaltyName} { // own's bit i: withBlock, withPenalty
		if own&(1<<i) != 0 {
			b = append(append(b, tag...), name...)
			ends = append(ends, len(b))
		}
	}
	for _, l := range limits {
		b = appendLimit(append(b, tag...), l)
		ends = append(ends, len(b))
	}
	all := string(b)
	start := 0
	for _, end := range ends {
		dst = append(dst, all[start:end])
		start = end
	}
	return dst
}

// appendTag appends "<prefix>{<key>}:" to b: a Cluster hash tag, so all of
// key's keys live in one slot. A hashed key (see store.Hashed) or one with
// a brace (which would end the tag early) goes as its digest.
func appendTag(b []byte, prefix, key string) []byte {
	b = append(b, prefix...)
	b = append(b, '{')
	if store.Hashed(key) || strings.ContainsAny(key, "{}") {
		b = store.AppendDigest(b, key)
	} else {
		b = append(b, key...)
	}
	return append(b, '}', ':')
}

// appendLimit appends the name of l: keyFormat, the algorithm's letter,
// the window ("v2:r1m", "v2:c250ms"), and a SlidingBuckets precision other
// than the default ("v2:b1h/1m").
func appendLimit(b []byte, l store.Limit) []byte {
	b = append(b, keyFormat...)
	b = append(b, "rbc"[l.Algorithm])
	b = store.AppendDuration(b, l.Window)
	if l.Algorithm == store.SlidingBuckets && l.Precision != 0 && l.Precision != store.DefaultPrecision(l.Window) {
		b = append(b, '/')
		b = store.AppendDuration(b, l.Precision)
	}
	return b
}

// Tag returns "<prefix>{<key>}:", the part shared by every storage key of
// key (the Cluster hash tag; a digest for a long key or one with braces).
func Tag(prefix, key string) string { return string(appendTag(nil, prefix, key)) }

// LimitName returns the part of a storage key that names l, such as
// "v2:r1m" (after Tag: "rw:{ip:203.0.113.9}:v2:r1m").
func LimitName(l store.Limit) string { return string(appendLimit(nil, l)) }
