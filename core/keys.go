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

// keyTag returns "<prefix>{<key>}:", the part of the storage key shared by
// every limit of key. The braces make it a Redis Cluster hash tag, so all
// limits of one key live in one slot. Keys longer than maxRawKey, keys with
// a brace (which would end the tag early) and keys starting with '#' (the
// mark of a hashed key) are replaced by '#' and 22 characters of SHA-256.
func keyTag(prefix, key string) string {
	if len(key) > maxRawKey || strings.ContainsAny(key, "{}") || key[0] == '#' {
		sum := sha256.Sum256([]byte(key))
		key = "#" + base64.RawURLEncoding.EncodeToString(sum[:16])
	}
	return prefix + "{" + key + "}:"
}

// storageKey returns the Redis key of limit l for the tag from keyTag:
// tag + algorithm letter + window ("l60000" for one minute, in ms, or in µs
// with a 'u' when not a whole number of ms), and for SlidingBuckets with a
// precision other than the default, "/" + precision in the same form.
func storageKey(tag string, l Limit) string {
	b := make([]byte, 0, len(tag)+16)
	b = append(b, tag...)
	b = append(b, l.Algorithm.letter())
	b = appendDuration(b, l.Window)
	if l.Algorithm == SlidingBuckets && l.Precision != 0 && l.Precision != (Limit{Window: l.Window}).precision() {
		b = append(b, '/')
		b = appendDuration(b, l.Precision)
	}
	return string(b)
}

func appendDuration(b []byte, d time.Duration) []byte {
	if d%time.Millisecond == 0 {
		return strconv.AppendInt(b, int64(d/time.Millisecond), 10)
	}
	return append(strconv.AppendInt(b, micros(d), 10), 'u')
}
