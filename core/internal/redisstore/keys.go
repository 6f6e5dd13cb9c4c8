package redisstore

import (
	"strings"

	"github.com/ratewindow/ratewindow/core/internal/store"
)

// blockName ends the name of a key's block key (see Limiter.Block):
// "rw:{ip:203.0.113.9}:block". No limit's name is a word.
const blockName = "block"

// penaltyName ends the name of a key's penalty key, which counts its
// denials under a Rule's Penalty: "rw:{ip:203.0.113.9}:penalty".
const penaltyName = "penalty"

// keyFormat starts the name of every limit's storage key, after the tag:
// the version of the formats of the values stored there (algorithms.lua's
// layouts), "rw:{ip:203.0.113.9}:v2:r1m". A library whose layouts differ
// takes another, so that two versions deciding on one Redis (a rolling
// deploy) never read each other's limit keys: each counts its own (see
// docs/redis.md). v1 (unmarked, "rw:{k}:r1m") held the sliding log as a
// compact string, a ring string or a paged hash; v2 holds it as a compact
// string or a sorted set. The block and penalty keys keep their names and
// their format in every version, so that a ban holds for all of them.
const keyFormat = "v2:"

// Which of a key's own keys appendKeys puts before its limits' keys.
const (
	withBlock   = 1 << iota // the block key
	withPenalty             // the penalty key, after the block key
)

// appendKeys appends to dst the block key of key and its penalty key, as
// own (withBlock, withPenalty) says, then the storage key of every limit of
// key: "<prefix>{<key>}:" (see appendTag) and the limit's name (see
// appendLimit), such as "rw:{ip:203.0.113.9}:v2:r1m". The keys are built
// into one buffer and share one string: one allocation in all.
func appendKeys(dst []string, prefix, key string, limits []store.Limit, own int) []string {
	var buf [256]byte
	b := appendTag(buf[:0], prefix, key)
	tag := len(b)
	var endsBuf [2 + store.MaxLimits]int
	ends := endsBuf[:0] // where each key ends in b
	for _, k := range [...]struct {
		flag int
		name string
	}{{withBlock, blockName}, {withPenalty, penaltyName}} {
		if own&k.flag == 0 {
			continue
		}
		if len(ends) > 0 {
			b = append(b, b[:tag]...)
		}
		b = append(b, k.name...)
		ends = append(ends, len(b))
	}
	for _, l := range limits {
		if len(ends) > 0 {
			b = append(b, b[:tag]...)
		}
		b = appendLimit(b, l)
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

// appendTag appends "<prefix>{<key>}:", the part of the storage key shared
// by every limit of key, to b. The braces make it a Redis Cluster hash tag,
// so all limits of one key live in one slot. Keys that the process keeps
// as a digest (see store.Hashed) and keys with a brace (which would end the
// tag early) are replaced by their digest (see store.AppendDigest).
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

// appendLimit appends the part of a storage key that names limit l: the
// key format (see keyFormat), the algorithm's letter and the window in its
// largest whole unit ("v2:r1m" for a sliding log of one minute, "v2:c250ms",
// "v2:b1500us"), and for SlidingBuckets with a precision other than the
// default, "/" + precision ("v2:b1h/1m").
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
