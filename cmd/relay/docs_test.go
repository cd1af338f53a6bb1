package main

// Tests of the documents: every relative link in the repository's Markdown
// files reaches a file (and, for a #fragment, a heading of it), and the
// settings table of cmd/relay/README.md has one row for each variable
// LoadConfig reads.

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// repoRoot is the repository, from this package's directory.
const repoRoot = "../.."

// markdownFiles lists the repository's .md files (not under .git, bin,
// data or node_modules), relative to repoRoot.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "bin", "data", "node_modules", "testdata":
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(d.Name(), ".md") {
			rel, _ := filepath.Rel(repoRoot, path)
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

var (
	mdLink     = regexp.MustCompile(`\]\(([^()\s]+)\)`)
	codeSpan   = regexp.MustCompile("`[^`]*`")
	headingPre = regexp.MustCompile(`^#{1,6}\s+`)
)

// prose is a Markdown file's lines with its fenced code blocks and code
// spans blanked, where a "](" is code, not a link.
func prose(text string) []string {
	lines := strings.Split(text, "\n")
	fenced := false
	for i, line := range lines {
		fence := strings.HasPrefix(strings.TrimSpace(line), "```")
		if fence {
			fenced = !fenced
		}
		if fence || fenced {
			lines[i] = ""
		} else {
			lines[i] = codeSpan.ReplaceAllString(line, "")
		}
	}
	return lines
}

// anchors are the fragments GitHub gives a Markdown file's headings: the
// text lowercased, with everything but letters, digits, spaces, hyphens and
// underscores dropped, spaces made hyphens, and -1, -2… after a repeat.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
		}
		if fenced || !headingPre.MatchString(line) {
			continue
		}
		h := headingPre.ReplaceAllString(line, "")
		var b strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteRune('-')
			}
		}
		slug := b.String()
		for i, s := 1, slug; ; i++ {
			if !out[s] {
				out[s] = true
				break
			}
			s = slug + "-" + strconv.Itoa(i)
		}
	}
	return out
}

// TestMarkdownLinks: every relative link of every .md file names a file or
// directory that exists, and a #fragment names a heading of the Markdown
// file it points into (or of the file itself).
func TestMarkdownLinks(t *testing.T) {
	t.Parallel()
	files := markdownFiles(t)
	if !slices.Contains(files, "README.md") || !slices.Contains(files, "cmd/relay/README.md") {
		t.Fatalf("markdown files %q lack README.md or cmd/relay/README.md", files)
	}
	texts := map[string]string{}
	read := func(name string) (string, bool) {
		if s, ok := texts[name]; ok {
			return s, true
		}
		b, err := os.ReadFile(filepath.Join(repoRoot, name))
		if err != nil {
			return "", false
		}
		texts[name] = string(b)
		return string(b), true
	}
	links := 0
	for _, name := range files {
		text, _ := read(name)
		for i, line := range prose(text) {
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				links++
				path, frag, _ := strings.Cut(target, "#")
				dest := name
				if path != "" {
					dest = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(name), path)))
					if strings.HasPrefix(dest, "../") {
						t.Errorf("%s:%d: %s leaves the repository", name, i+1, target)
						continue
					}
					if _, err := os.Stat(filepath.Join(repoRoot, dest)); err != nil {
						t.Errorf("%s:%d: %s: no such file (%s)", name, i+1, target, dest)
						continue
					}
				}
				if frag == "" {
					continue
				}
				if !strings.HasSuffix(dest, ".md") {
					continue // a line or a section of another kind of file
				}
				destText, _ := read(dest)
				if !anchors(destText)[frag] {
					t.Errorf("%s:%d: %s: %s has no heading #%s", name, i+1, target, dest, frag)
				}
			}
		}
	}
	if links < 50 {
		t.Errorf("only %d relative links found: the scan is broken", links)
	}
}

// TestSettingsDocumented: the settings table of cmd/relay/README.md ›
// Configuration has exactly one row for each variable LoadConfig reads
// (configVars), and names no other: one table, one meaning per setting.
func TestSettingsDocumented(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	start := strings.Index(text, "\n## Configuration\n")
	if start < 0 {
		t.Fatal("cmd/relay/README.md has no ## Configuration")
	}
	section := text[start+1:]
	if end := strings.Index(section[1:], "\n## "); end >= 0 {
		section = section[:end+1]
	}
	rows := map[string]int{}
	name := regexp.MustCompile("`([A-Z][A-Z0-9_]+)`")
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		first := strings.SplitN(line, "|", 3)[1]
		for _, m := range name.FindAllStringSubmatch(first, -1) {
			rows[m[1]]++
		}
	}
	for _, v := range configVars {
		switch rows[v] {
		case 1:
		case 0:
			t.Errorf("%s is read by LoadConfig and has no row in cmd/relay/README.md › Configuration", v)
		default:
			t.Errorf("%s has %d rows in cmd/relay/README.md › Configuration, want one", v, rows[v])
		}
	}
	for v := range rows {
		if !slices.Contains(configVars, v) {
			t.Errorf("cmd/relay/README.md › Configuration has a row for %s, which LoadConfig does not read", v)
		}
	}
	// No other document keeps a copy of the table.
	for _, doc := range markdownFiles(t) {
		if doc == "cmd/relay/README.md" {
			continue
		}
		d, _ := os.ReadFile(filepath.Join(repoRoot, doc))
		if strings.Contains(string(d), "| variable | default | meaning |") {
			t.Errorf("%s has a settings table too: cmd/relay/README.md › Configuration is the one", doc)
		}
	}
}
