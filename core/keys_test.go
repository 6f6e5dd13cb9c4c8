package core

import (
	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core/internal/redisstore"
)

// keyTag is the hash tag part of key's storage keys under prefix.
func keyTag(prefix, key string) string { return redisstore.Tag(prefix, key) }

// storageKey is the storage key of limit l after tag.
func storageKey(tag string, l Limit) string { return tag + redisstore.LimitName(l.spec()) }

// isScriptCall reports whether cmd runs a script: EVALSHA, EVAL or FCALL.
func isScriptCall(cmd redis.Cmder) bool {
	n := cmd.Name()
	return n == "evalsha" || n == "eval" || n == "fcall"
}
