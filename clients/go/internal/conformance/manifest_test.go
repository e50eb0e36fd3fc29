package conformance_test

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/prism-envelope/prism/clients/go/internal/conformance"
)

// RunByGo are the kinds whose every vector the Go tests run (each package's
// conformance_test.go reads the manifest's files of its kind).
var RunByGo = map[string]string{
	"signature":     "signing.TestSignatureVectors",
	"envelope":      "envelope.TestEnvelopeVectors",
	"conversion":    "envelope.TestConversionVectors",
	"negative":      "envelope.TestNegativeDecodeVectors, signing.TestNegativeVerifyVectors",
	"encryption":    "encryption.TestEncryptionVectors",
	"key_wrap":      "encryption.TestKeyWrapVectors",
	"lnmp":          "lnmp.TestLNMPVectors",
	"kafka_headers": "kafka.TestKafkaHeaderVectors",
	"expiry":        "envelope.TestExpiryVectors",
}

// NotInGoClient are the kinds the Go client does not implement, with why (none today).
var NotInGoClient = map[string]string{}

// TestManifest: every file of manifest.json exists with its recorded SHA-256 (a hand edit
// fails here), and its kind is run by a Go runner or named in NotInGoClient - a kind added
// to the suite fails this test until the Go client handles it.
func TestManifest(t *testing.T) {
	files, err := conformance.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 10 {
		t.Fatalf("manifest lists only %d files", len(files))
	}
	for _, f := range files {
		raw, err := os.ReadFile(filepath.Join(conformance.Dir(), f.Path))
		if err != nil {
			t.Errorf("%s: %v", f.Path, err)
			continue
		}
		sum := sha256.Sum256(raw)
		if hex.EncodeToString(sum[:]) != f.SHA256 {
			t.Errorf("%s: SHA-256 differs from manifest.json (edited by hand? regenerate with python -m conformance.generate)", f.Path)
		}
		if _, ok := RunByGo[f.Kind]; !ok {
			if why, ok := NotInGoClient[f.Kind]; ok {
				t.Logf("%s: kind %s not run by the Go client: %s", f.Path, f.Kind, why)
				continue
			}
			t.Errorf("%s: kind %q has no Go runner", f.Path, f.Kind)
		}
	}
	// The explicit list, printed on every run (go test -v): what the Go client does not run.
	if len(NotInGoClient) == 0 {
		t.Logf("kinds not run by the Go client: none (each runner also checks it ran every vector of its kind)")
	}
	for kind, why := range NotInGoClient {
		t.Logf("kind not run by the Go client: %s (%s)", kind, why)
	}
}
