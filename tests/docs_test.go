package tests

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Documents are for users: README, docs/ and BENCHMARKS.md say what is
// true now and how to reproduce it. History is git's.

// diaryText are the marks of a diary in a document: dated runs and
// numbered work periods (hasHash finds the third: builds named by hash).
var diaryText = []struct {
	re   *regexp.Regexp
	what string
}{
	{regexp.MustCompile(`\b20\d\d-[01]\d-[0-3]\d\b`), "a date"},
	{regexp.MustCompile(`(?i)\bsessions? \d+\b|\b(earlier|previous) sessions\b|\bwork periods?\b`), "a work period"},
}

// hexWord is a word that may be a commit hash: a digit and a letter
// among 7 to 12 hex digits (a short hash) or 40 (a full one); a 16-digit
// GUID is not one.
var hexWord = regexp.MustCompile(`\b[0-9a-f]{7,40}\b`)

func hasHash(line string) bool {
	for _, w := range hexWord.FindAllString(line, -1) {
		if (len(w) <= 12 || len(w) == 40) && strings.ContainsAny(w, "0123456789") && strings.ContainsAny(w, "abcdef") {
			return true
		}
	}
	return false
}

// docLimits are the documents' line budgets: a report and a map, not a
// record of how they came to be.
var docLimits = map[string]int{"BENCHMARKS.md": 400, "docs/architecture.md": 450}

// diaryLines returns the lines of text that read as a diary, as "line N:
// what: text".
func diaryLines(text string) []string {
	var bad []string
	for i, line := range strings.Split(text, "\n") {
		for _, d := range diaryText {
			if d.re.MatchString(line) {
				bad = append(bad, fmt.Sprintf("line %d: %s: %s", i+1, d.what, strings.TrimSpace(line)))
			}
		}
		if hasHash(line) {
			bad = append(bad, fmt.Sprintf("line %d: a commit hash: %s", i+1, strings.TrimSpace(line)))
		}
	}
	return bad
}

// trackedFiles lists the repository's files matching the git pathspecs.
func trackedFiles(t *testing.T, top string, specs ...string) []string {
	t.Helper()
	out, err := exec.Command("git", append([]string{"-C", top, "ls-files"}, specs...)...).Output()
	if err != nil {
		t.Skipf("git ls-files: %v (not a git checkout)", err)
	}
	return strings.Fields(string(out))
}

func TestDocumentsAreNotDiaries(t *testing.T) {
	top, _ := filepath.Abs("..")
	docs := trackedFiles(t, top, "*.md")
	if len(docs) < 5 {
		t.Fatalf("only %d markdown files found: %v", len(docs), docs)
	}
	for _, doc := range docs {
		b, err := os.ReadFile(filepath.Join(top, doc))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range diaryLines(string(b)) {
			t.Errorf("%s %s (say what is true now; git keeps the history)", doc, l)
		}
		if max, ok := docLimits[doc]; ok {
			if n := bytes.Count(b, []byte("\n")); n > max {
				t.Errorf("%s has %d lines, more than its %d", doc, n, max)
			}
		}
	}
	for doc := range docLimits {
		if _, err := os.Stat(filepath.Join(top, doc)); err != nil {
			t.Errorf("%s: %v", doc, err)
		}
	}
}

// TestCodeCommentsAreNotDiaries: comments and scripts carry no dated runs
// or work periods either (commit hashes are left to the documents' check:
// code has hex constants).
func TestCodeCommentsAreNotDiaries(t *testing.T) {
	top, _ := filepath.Abs("..")
	files := trackedFiles(t, top, "*.go", "*.sh", "*.py", "Makefile")
	if len(files) < 50 {
		t.Fatalf("only %d source files found", len(files))
	}
	for _, f := range files {
		if f == "tests/docs_test.go" { // its examples of diary text
			continue
		}
		b, err := os.ReadFile(filepath.Join(top, f))
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			for _, d := range diaryText {
				if d.re.MatchString(line) {
					t.Errorf("%s line %d: %s: %s", f, i+1, d.what, strings.TrimSpace(line))
				}
			}
		}
	}
}

// TestDiaryLinesSeen: the patterns catch the diary text they are for and
// pass the technical uses of the same words.
func TestDiaryLinesSeen(t *testing.T) {
	for _, diary := range []string{
		"**Session 14 (2026-12-02, 09:42-10:35, load 1-3).**",
		"Three runs of `make bench` on 2026-12-01, on a machine shared with other",
		"the build the session started from (c756565, 1",
		"five of the build the session started from (efec237: 3 `ONLY=veth`, then",
		"the final build b614e63, 1 full (04:27, under \"Latest results\") and 2",
		"(see \"Session 13\").",
		"as in earlier sessions",
		"the figures of previous sessions",
	} {
		if len(diaryLines(diary)) == 0 {
			t.Errorf("not seen as a diary: %q", diary)
		}
	}
	for _, fine := range []string{
		"authenticated sessions: HMAC-SHA256 per packet, a replay window per session",
		"a daemon in a new session (setsid)",
		"the DCT keeps only the latest session's state per initiator",
		"a valid packet arrived in this session",
		"`krfs version` prints the version, commit and build date",
		"kernel 6.18, Go 1.26, 2 vCPUs",
		"mlx5_0  guid 0c42a1030012ab34  fw 16.35.2000",
	} {
		if l := diaryLines(fine); len(l) > 0 {
			t.Errorf("technical text taken for a diary: %v", l)
		}
	}
}
