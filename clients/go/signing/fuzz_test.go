package signing_test

import (
	"errors"
	"testing"

	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/internal/conformance"
	"github.com/prism-envelope/prism/clients/go/prismerr"
	"github.com/prism-envelope/prism/clients/go/signing"
)

// FuzzVerify: verifying any bytes against the vector keys gives a verdict or a typed error,
// never a panic; seeds are every input of the conformance suite.
func FuzzVerify(f *testing.F) {
	seeds, err := conformance.Seeds()
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range seeds {
		f.Add(s)
	}
	files, err := conformance.SignatureFiles()
	if err != nil {
		f.Fatal(err)
	}
	keys := signing.NewKeys()
	for _, file := range files {
		for _, k := range keysOf(&testing.T{}, file.Key).All() {
			keys.Add(k)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, lay := range []envelope.Layout{envelope.Auto, envelope.Draft, envelope.Reviewed} {
			_, err := signing.Verify(data, keys, signing.VerifyOptions{Layout: lay})
			var pe *prismerr.Error
			if err != nil && !errors.As(err, &pe) {
				t.Fatalf("Verify returned an untyped error: %v", err)
			}
			_, _, err = signing.SignedMessage(data, lay)
			if err != nil && !errors.As(err, &pe) {
				t.Fatalf("SignedMessage returned an untyped error: %v", err)
			}
		}
	})
}
