// Package untrustedjson holds the checks every JSON document that came from outside the
// client passes before it is parsed, the Go twin of app/untrusted_json.py: valid UTF-8 and at
// most MaxDepth levels of arrays and objects. encoding/json alone replaces invalid UTF-8 with
// U+FFFD (a value where Python and Rust refuse the document) and nests 10,000 levels deep.
package untrustedjson

import (
	"strconv"
	"unicode/utf8"
)

// MaxDepth is the deepest nesting of arrays and objects accepted (Python's DEFAULT_MAX_DEPTH).
const MaxDepth = 64

// Depth is the bracket nesting of a JSON text (strings skipped), without parsing it: exact for
// valid JSON; for invalid text it may be anything, but the parser then refuses the text anyway.
func Depth(text []byte) int {
	depth, max, inStr, esc := 0, 0, false, false
	for _, c := range text {
		switch {
		case inStr:
			if esc {
				esc = false
			} else if c == '\\' {
				esc = true
			} else if c == '"' {
				inStr = false
			}
		case c == '"':
			inStr = true
		case c == '{' || c == '[':
			depth++
			if depth > max {
				max = depth
			}
		case c == '}' || c == ']':
			depth--
		}
	}
	return max
}

// Check returns what is wrong with data before it may be parsed as JSON, or "".
func Check(data []byte, maxDepth int) string {
	if !utf8.Valid(data) {
		return "JSON is not valid UTF-8"
	}
	if d := Depth(data); d > maxDepth {
		return "JSON is nested too deeply: " + strconv.Itoa(d) + " levels, over the limit of " + strconv.Itoa(maxDepth)
	}
	return ""
}
