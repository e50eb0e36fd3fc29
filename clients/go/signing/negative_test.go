package signing_test

import (
	"encoding/hex"
	"testing"

	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/internal/conformance"
	"github.com/prism-envelope/prism/clients/go/signing"
)

// TestNegativeVerifyVectors: decode-and-verify every hostile input of conformance/negative/
// with the file's key and the secure default; the verdict must be expected_verify (an input
// that does not decode never verifies).
func TestNegativeVerifyVectors(t *testing.T) {
	var ran conformance.Counter
	defer ran.Check(t, "negative")
	var file struct {
		Key     conformance.Key `json:"key"`
		Vectors []struct {
			Name     string `json:"name"`
			InputHex string `json:"input_hex"`
			Limits   *struct {
				MaxMessageBytes int `json:"max_message_bytes"`
				MaxHeaderBytes  int `json:"max_header_bytes"`
			} `json:"limits"`
			ExpectedVerify string `json:"expected_verify"`
		} `json:"vectors"`
	}
	paths, err := conformance.FilesOfKind("negative")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range paths {
		file.Vectors = nil
		if err := conformance.File(path, &file); err != nil {
			t.Fatal(err)
		}
		keys := keysOf(t, file.Key)
		for _, v := range file.Vectors {
			t.Run(v.Name, func(t *testing.T) {
				ran.Ran()
				in, _ := hex.DecodeString(v.InputHex)
				opts := signing.VerifyOptions{}
				if v.Limits != nil {
					opts.Limits = &envelope.Limits{MaxMessageBytes: v.Limits.MaxMessageBytes, MaxHeaderBytes: v.Limits.MaxHeaderBytes}
				}
				_, _, err := signing.VerifyAndDecode(in, keys, opts)
				if got := verdict(err); got != v.ExpectedVerify {
					t.Errorf("got %s (%v), want %s", got, err, v.ExpectedVerify)
				}
			})
		}
	}
}
