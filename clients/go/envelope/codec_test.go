package envelope_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/prismerr"
)

// groups is n unknown groups (field 50) nested in each other.
func groups(n int) []byte {
	return append(bytes.Repeat([]byte{0x93, 0x03}, n), bytes.Repeat([]byte{0x94, 0x03}, n)...)
}

func lenRecord(tag byte, value []byte) []byte {
	return append(envelope.AppendVarint([]byte{tag}, uint64(len(value))), value...)
}

// TestUnknownGroupsKeepTheRecursionLimit: groups kept as unknown fields count toward the
// recursion limit of 100, as in upb (Python's verdicts below). Go's runtime skips an unknown
// group with its own limit of 10,000, so a metadata holding 100 nested groups, which Python
// refuses, decoded in Go. A draft header's unknown group is refused by the conversion, as in
// Python.
func TestUnknownGroupsKeepTheRecursionLimit(t *testing.T) {
	for _, c := range []struct {
		name string
		data []byte
		ok   bool
	}{
		{"reviewed metadata, 99 groups", lenRecord(0x0a, groups(99)), true},
		{"reviewed metadata, 100 groups", lenRecord(0x0a, groups(100)), false},
		{"reviewed metadata, 40000 groups", lenRecord(0x0a, groups(40000)), false},
		// security (depth 1) > encryption (depth 2) > groups
		{"reviewed encryption, 98 groups", append([]byte{0x0a, 0x00}, lenRecord(0x12, lenRecord(0x32, groups(98)))...), true},
		{"reviewed encryption, 99 groups", append([]byte{0x0a, 0x00}, lenRecord(0x12, lenRecord(0x32, groups(99)))...), false},
		{"draft metadata, 1 group", append([]byte{0x08, 0x01}, lenRecord(0x12, groups(1))...), false},
	} {
		_, err := envelope.Decode(c.data)
		if c.ok && err != nil || !c.ok && !errors.Is(err, prismerr.ErrDecode) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}
