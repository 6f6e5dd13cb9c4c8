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
// and per-key structures: longer than MaxRawKey, or starting with '#' (so
// that no key can pose as another's digest).
func Hashed(key string) bool { return len(key) > MaxRawKey || key != "" && key[0] == '#' }

// AppendDigest appends '#' and the first 128 bits of key's SHA-256 in
// base64url to b (a collision takes about 2^64 tries).
func AppendDigest(b []byte, key string) []byte {
	sum := sha256.Sum256([]byte(key))
	b = append(b, '#')
	return base64.RawURLEncoding.AppendEncode(b, sum[:16])
}

// HeldKey returns key, or its digest when Hashed; it allocates only for
// a digest. To keep it, use OwnKey: a short key may be a slice of a larger
// string, which keeping it would keep whole.
func HeldKey(key string) string {
	if !Hashed(key) {
		return key
	}
	var buf [DigestLen]byte
	return string(AppendDigest(buf[:0], key))
}

// OwnKey returns h, a result of HeldKey, as a string of its own.
func OwnKey(h string) string {
	if Hashed(h) {
		return h
	}
	return strings.Clone(h)
}

// AppendDuration appends d in its largest whole unit: 1h, 15m, 30s,
// 250ms, 1500us, or ns.
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
