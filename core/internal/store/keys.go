package store

import (
	"crypto/sha256"
	"encoding/base64"
	"strconv"
	"strings"
	"time"
)

// MaxRawKey is the longest key kept as is; longer keys are hashed.
const MaxRawKey = 128

// DigestLen is the length of a digest written by AppendDigest.
const DigestLen = 1 + 22

// Hashed reports whether key is replaced by its digest, in storage keys
// and in every per-key structure of the process (the deny cache, the
// memory backend): keys longer than MaxRawKey, and keys starting with '#'
// (the mark of a digest, so that no key can pose as another's digest).
func Hashed(key string) bool { return len(key) > MaxRawKey || key != "" && key[0] == '#' }

// AppendDigest appends the digest of key to b: '#' and the first 128 bits
// of its SHA-256 in 22 characters of base64url. Two keys share a digest
// only by a collision of SHA-256 in 128 bits: about 2^64 keys must be
// tried to find any such pair, so a key never stands for another.
func AppendDigest(b []byte, key string) []byte {
	sum := sha256.Sum256([]byte(key))
	b = append(b, '#')
	return base64.RawURLEncoding.AppendEncode(b, sum[:16])
}

// HeldKey returns the form of key that a per-key structure of the process
// keeps: key itself, at most MaxRawKey bytes, or its digest of DigestLen
// bytes (see Hashed). It allocates only for a digest. A structure keeps a
// string of its own (see OwnKey): a short key may share its memory with a
// larger string (a slice of a request's buffer), which keeping the key
// would keep whole.
func HeldKey(key string) string {
	if !Hashed(key) {
		return key
	}
	var buf [DigestLen]byte
	return string(AppendDigest(buf[:0], key))
}

// OwnKey returns h, a result of HeldKey, as a string of its own, for a map
// to keep: a digest is one already; a short key is copied.
func OwnKey(h string) string {
	if Hashed(h) {
		return h
	}
	return strings.Clone(h)
}

// AppendDuration appends d in its largest whole unit: 1h, 15m, 30s,
// 250ms, 1500us, or ns. The units are told apart by their names ("1m" is a
// minute, "1ms" a millisecond), so the text is short and never ambiguous.
func AppendDuration(b []byte, d time.Duration) []byte {
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
