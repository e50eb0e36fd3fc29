package registry_test

import (
	"testing"

	"github.com/prism-envelope/prism/clients/go/registry"
)

// TestTextHashIsPythons: the hashes below are what Python's app.schema.canonical.schema_hash
// gives for these texts (computed with it): sorted keys, Python's float repr (1e+16, 1e-05,
// 100.0), big and negative-zero integers, non-ASCII and U+2028 kept raw, control characters
// escaped.
func TestTextHashIsPythons(t *testing.T) {
	for _, c := range []struct{ kind, text, want string }{
		{"avro", `{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"string","default":"é\u2028x"},{"name":"n","type":"double","default":1e16},{"name":"m","type":"double","default":0.00001},{"name":"k","type":"double","default":100.0},{"name":"i","type":"long","default":-0},{"name":"ship_to","type":"common.Address"}]}`,
			"sha256:a87cd19487748b4016908d3fca5998cdd621089f868e3863c902281f4ef7eb3c"},
		{"json", `{"$ref":"address.json","b":[1,2.5,3E2,"\t\u0001\"q"],"a":{"z":true,"y":null,"x":123456789012345678901234567890}}`,
			"sha256:2e775106439f3903af0488dfa5a514ab390781c5ed7968ee95224f0264f5adbc"},
		{"json", `{"x":1.5e-7,"y":12345678.9,"z":0.1,"w":-2.0E+20}`,
			"sha256:94430d1225678635237809b3f797ddcdbe100bbe8f39018a0b04e7f331b1341b"},
	} {
		got, ok := registry.TextHash(c.kind, c.text)
		if !ok || got != c.want {
			t.Errorf("%s %.40s: %s (%v), want %s", c.kind, c.text, got, ok, c.want)
		}
	}
	if _, ok := registry.TextHash("protobuf", `syntax = "proto3";`); ok {
		t.Error("protobuf has no text hash in Go")
	}
}
