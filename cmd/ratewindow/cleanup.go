package main

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// The limit keys of the key format before "v2:" were named
// "<prefix>{<key>}:<algorithm><window>[/<precision>]", such as
// "rw:{ip:203.0.113.9}:r1m" (now "rw:{ip:203.0.113.9}:v2:r1m"). This
// release never reads them, and most expire by their TTL; but that format
// wrote a sliding log of more than 4,096 units as a hash and set its TTL
// before the hash existed, so such a key never expires. cleanup finds and
// deletes every limit key of that format. The block and penalty keys are
// shared by both formats and are left alone.

// formerDuration is a window or precision as both formats write it
// (store.AppendDuration): "1m", "250ms", "90s".
const formerDuration = `[0-9]+(?:h|m|s|ms|us|ns)`

// formerKeys returns the pattern of the former format's limit keys under
// prefix, and the SCAN MATCH pattern that finds their candidates.
func formerKeys(prefix string) (*regexp.Regexp, string, error) {
	re, err := regexp.Compile(`^` + regexp.QuoteMeta(prefix) + `\{[^{}]*\}:[rbc]` + formerDuration + `(?:/` + formerDuration + `)?$`)
	if err != nil {
		return nil, "", fmt.Errorf("cleanup: prefix %q: %w", prefix, err)
	}
	glob := strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`).Replace(prefix)
	return re, glob + "{*}:[rbc]*", nil
}

// cleanupReport is what cleanup found and did, as -json prints it.
type cleanupReport struct {
	Prefix     string `json:"prefix"`
	Found      int    `json:"found"`       // limit keys of the former format
	WithoutTTL int    `json:"without_ttl"` // of those, the ones that would never expire
	Deleted    int    `json:"deleted"`
}

// batch is how many keys one pipeline reads or deletes.
const batch = 1000

func (c *cli) cleanup(_ []string) error {
	re, match, err := formerKeys(c.opt.prefix)
	if err != nil {
		return err
	}
	keys, err := scanAll(c.ctx, c.rdb, match, re)
	if err != nil {
		return fmt.Errorf("cleanup: scan: %w", err)
	}
	rep := cleanupReport{Prefix: c.opt.prefix, Found: len(keys)}
	if rep.WithoutTTL, err = countWithoutTTL(c.ctx, c.rdb, keys); err != nil {
		return fmt.Errorf("cleanup: %w", err)
	}
	if len(keys) == 0 {
		if c.opt.json {
			return c.printJSON(rep)
		}
		fmt.Fprintf(c.stdout, "no limit key of the former format (before v2) under the prefix %q\n", c.opt.prefix)
		return nil
	}
	if len(keys) > 1 && !c.opt.yes {
		what := fmt.Sprintf("cleanup: delete %d limit keys of the former format (before v2) under the prefix %q, %d of them without a TTL, such as %s",
			len(keys), c.opt.prefix, rep.WithoutTTL, strings.Join(keys[:min(len(keys), 3)], ", "))
		if err := confirm("cleanup", what, c.stdin, c.stderr); err != nil {
			return err
		}
	}
	// The time spent on the question is not the deletion's.
	ctx, cancel := context.WithTimeout(context.Background(), c.opt.timeout)
	defer cancel()
	rep.Deleted, err = deleteKeys(ctx, c.rdb, keys)
	if c.opt.json {
		if jerr := c.printJSON(rep); jerr != nil {
			return errors.Join(err, jerr)
		}
	} else {
		fmt.Fprintf(c.stdout, "deleted %d of %d limit keys of the former format under the prefix %q (%d of them had no TTL)\n",
			rep.Deleted, rep.Found, c.opt.prefix, rep.WithoutTTL)
	}
	if err != nil {
		return fmt.Errorf("cleanup: deleted %d of %d keys: %w", rep.Deleted, rep.Found, err)
	}
	return nil
}

// scanAll SCANs every master of rdb (the one server, or each master of a
// Cluster) for the keys that match the SCAN pattern match and re, and
// returns them sorted, each once.
func scanAll(ctx context.Context, rdb redis.UniversalClient, match string, re *regexp.Regexp) ([]string, error) {
	var mu sync.Mutex
	var keys []string
	scan := func(ctx context.Context, node *redis.Client) error {
		iter := node.Scan(ctx, 0, match, batch).Iterator()
		for iter.Next(ctx) {
			if k := iter.Val(); re.MatchString(k) {
				mu.Lock()
				keys = append(keys, k)
				mu.Unlock()
			}
		}
		return iter.Err()
	}
	var err error
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, scan)
	case *redis.Client:
		err = scan(ctx, c)
	default:
		err = fmt.Errorf("a client of type %T cannot be scanned", rdb)
	}
	slices.Sort(keys)
	return slices.Compact(keys), err // SCAN may return a key twice
}

// countWithoutTTL returns how many of keys have no TTL.
func countWithoutTTL(ctx context.Context, rdb redis.UniversalClient, keys []string) (int, error) {
	ttls, err := pipelined(ctx, rdb, keys, func(p redis.Pipeliner, k string) *redis.DurationCmd { return p.PTTL(ctx, k) })
	if err != nil {
		return 0, fmt.Errorf("read TTLs: %w", err)
	}
	n := 0
	for _, t := range ttls {
		if t.Val() == -1 { // the key exists and has no TTL (-2: it is gone)
			n++
		}
	}
	return n, nil
}

// deleteKeys deletes keys and returns how many it deleted.
func deleteKeys(ctx context.Context, rdb redis.UniversalClient, keys []string) (int, error) {
	dels, err := pipelined(ctx, rdb, keys, func(p redis.Pipeliner, k string) *redis.IntCmd { return p.Del(ctx, k) })
	n := 0
	for _, d := range dels {
		n += int(d.Val())
	}
	return n, err
}

// pipelined queues one command a key with queue, batch keys a pipeline
// (single-key commands: the keys of a Cluster lie in many slots), and
// returns the commands sent, in keys' order, up to the first pipeline that
// failed.
func pipelined[C redis.Cmder](ctx context.Context, rdb redis.UniversalClient, keys []string, queue func(redis.Pipeliner, string) C) ([]C, error) {
	cmds := make([]C, 0, len(keys))
	for chunk := range slices.Chunk(keys, batch) {
		pipe := rdb.Pipeline()
		for _, k := range chunk {
			cmds = append(cmds, queue(pipe, k))
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return cmds, err
		}
	}
	return cmds, nil
}
