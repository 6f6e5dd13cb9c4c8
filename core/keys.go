package core

import (
	"crypto/sha256"
	"encoding/base64"
	"strconv"
	"strings"
	"time"
)

// maxRawKey is the longest key stored as is; longer keys are hashed.
const maxRawKey = 128

// blockName ends the name of a key's block key (see Limiter.Block):
// "rw:{ip:203.0.113.9}:block". No limit's name is a word.
const blockName = "block"

// penaltyName ends the name of a key's penalty key, which counts its
// denials under a Rule's Penalty: "rw:{ip:203.0.113.9}:penalty".
const penaltyName = "penalty"

// Which of a key's own keys appendKeys puts before its limits' keys.
const (
	withBlock   = 1 << iota // the block key
	withPenalty             // the penalty key, after the block key
)

// appendKeys appends to dst the block key of key and its penalty key, as
// own (withBlock, withPenalty) says, then the storage key of every limit of
// key: "<prefix>{<key>}:" (see appendTag) and the limit's name (see
// appendLimit), such as "rw:{ip:203.0.113.9}:r1m". The keys are built
// into one buffer and share one string: one allocation in all.
func appendKeys(dst []string, prefix, key string, limits []Limit, own int) []string {
	var buf [256]byte
	b := appendTag(buf[:0], prefix, key)
	tag := len(b)
	var endsBuf [2 + MaxLimits]int
	ends := endsBuf[:0] // where each key ends in b
	if 2+len(limits) > len(endsBuf) {
		ends = make([]int, 0, 2+len(limits))
	}
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
// as a digest (see hashedKey) and keys with a brace (which would end the
// tag early) are replaced by their digest (see appendDigest).
func appendTag(b []byte, prefix, key string) []byte {
	b = append(b, prefix...)
	b = append(b, '{')
	if hashedKey(key) || strings.ContainsAny(key, "{}") {
		b = appendDigest(b, key)
	} else {
		b = append(b, key...)
	}
	return append(b, '}', ':')
}

// hashedKey reports whether key is replaced by its digest, in storage keys
// and in every per-key structure of the process (the deny cache, the
// memory backend): keys longer than maxRawKey, and keys starting with '#'
// (the mark of a digest, so that no key can pose as another's digest).
func hashedKey(key string) bool { return len(key) > maxRawKey || key != "" && key[0] == '#' }

// digestLen is the length of a digest written by appendDigest.
const digestLen = 1 + 22

// appendDigest appends the digest of key to b: '#' and the first 128 bits
// of its SHA-256 in 22 characters of base64url. Two keys share a digest
// only by a collision of SHA-256 in 128 bits: about 2^64 keys must be
// tried to find any such pair, so a key never stands for another.
func appendDigest(b []byte, key string) []byte {
	sum := sha256.Sum256([]byte(key))
	b = append(b, '#')
	return base64.RawURLEncoding.AppendEncode(b, sum[:16])
}

// heldKey returns the form of key that a per-key structure of the process
// keeps: key itself, at most maxRawKey bytes, or its digest of digestLen
// bytes (see hashedKey). It allocates only for a digest. A structure keeps
// a string of its own (see ownKey): a short key may share its memory with
// a larger string (a slice of a request's buffer), which keeping the key
// would keep whole.
func heldKey(key string) string {
	if !hashedKey(key) {
		return key
	}
	var buf [digestLen]byte
	return string(appendDigest(buf[:0], key))
}

// ownKey returns h, a result of heldKey, as a string of its own, for a map
// to keep: a digest is one already; a short key is copied.
func ownKey(h string) string {
	if hashedKey(h) {
		return h
	}
	return strings.Clone(h)
}

// appendLimit appends the part of a storage key that names limit l: the
// algorithm's letter and the window in its largest whole unit ("r1m" for a
// sliding log of one minute, "c250ms", "b1500us"), and for SlidingBuckets
// with a precision other than the default, "/" + precision ("b1h/1m").
func appendLimit(b []byte, l Limit) []byte {
	b = append(b, l.Algorithm.letter())
	b = appendDuration(b, l.Window)
	if l.Algorithm == SlidingBuckets && l.Precision != 0 && l.Precision != (Limit{Window: l.Window}).precision() {
		b = append(b, '/')
		b = appendDuration(b, l.Precision)
	}
	return b
}

// appendDuration appends d in its largest whole unit: 1h, 15m, 30s,
// 250ms, 1500us, or ns. The units are told apart by their names ("1m" is a
// minute, "1ms" a millisecond), so the text is short and never ambiguous.
func appendDuration(b []byte, d time.Duration) []byte {
	units := [...]struct {
		d    time.Duration
		name string
	}{{time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}, {time.Millisecond, "ms"}, {time.Microsecond, "us"}}
	for _, u := range units {
		if d >= u.d && d%u.d == 0 {
			return append(strconv.AppendInt(b, int64(d/u.d), 10), u.name...)
		}
	}
	return append(strconv.AppendInt(b, int64(d), 10), "ns"...)
}
