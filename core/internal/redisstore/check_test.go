package redisstore

import (
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestCheckListsEveryCommand: check.lua asks the ACL about exactly the
// commands the scripts run on keys (every call('X' of their source, but
// TIME, which it runs), so that Check fails where a decision would.
func TestCheckListsEveryCommand(t *testing.T) {
	var run []string
	for _, src := range []string{algorithmsLua, allowLua, allowBatchLua, reserveLua, releaseLua, resetLua, blockLua, refundLua} {
		for _, m := range regexp.MustCompile(`call\('([A-Z]+)'`).FindAllStringSubmatch(src, -1) {
			if m[1] != "TIME" && !slices.Contains(run, m[1]) {
				run = append(run, m[1])
			}
		}
	}
	list := regexp.MustCompile(`string\.gmatch\('([A-Z ]+)' \.\.\s*'([A-Z ]+)'`).FindStringSubmatch(checkLua)
	if list == nil {
		t.Fatal("check.lua's list of commands not found")
	}
	checked := strings.Fields(list[1] + " " + list[2])
	slices.Sort(run)
	slices.Sort(checked)
	if !slices.Equal(run, checked) {
		t.Fatalf("the scripts run %v\ncheck.lua checks %v", run, checked)
	}
}
