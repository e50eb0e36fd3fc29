package encryption

import (
	"regexp"
	"strconv"
	"strings"

	"github.com/prism-envelope/prism/clients/go/gen/reviewedpb"
	"github.com/prism-envelope/prism/clients/go/prismerr"
)

// Canonical algorithm names (docs/encryption.md, "Algorithms").
const (
	AES256GCM        = "aes-256-gcm"
	ChaCha20Poly1305 = "chacha20-poly1305"
	RSAOAEP3072      = "rsa-oaep-3072"
	RSAOAEP4096      = "rsa-oaep-4096"
	MLKEM768         = "ml-kem-768"
	MLKEM1024        = "ml-kem-1024"
	X25519MLKEM1024  = "x25519-ml-kem-1024"
)

type pattern int

const (
	symmetric pattern = iota + 1
	asymmetric
	postQuantum
	hybrid
)

// spec describes one algorithm.
type spec struct {
	name     string
	pattern  pattern
	fips     bool
	rsaBits  int
	kemBits  int    // 768 or 1024
	legacyOf string // set for RFC-031 spellings accepted on decrypt only
}

func (s spec) encryptionType() reviewedpb.EncryptionType {
	switch s.pattern {
	case symmetric:
		return reviewedpb.EncryptionType_ENCRYPTION_TYPE_SYMMETRIC
	case asymmetric:
		return reviewedpb.EncryptionType_ENCRYPTION_TYPE_ASYMMETRIC
	case postQuantum:
		return reviewedpb.EncryptionType_ENCRYPTION_TYPE_POST_QUANTUM
	}
	return reviewedpb.EncryptionType_ENCRYPTION_TYPE_HYBRID
}

var approved = map[string]spec{
	AES256GCM:        {name: AES256GCM, pattern: symmetric, fips: true},
	ChaCha20Poly1305: {name: ChaCha20Poly1305, pattern: symmetric},
	RSAOAEP3072:      {name: RSAOAEP3072, pattern: asymmetric, fips: true, rsaBits: 3072},
	RSAOAEP4096:      {name: RSAOAEP4096, pattern: asymmetric, fips: true, rsaBits: 4096},
	MLKEM768:         {name: MLKEM768, pattern: postQuantum, fips: true, kemBits: 768},
	MLKEM1024:        {name: MLKEM1024, pattern: postQuantum, fips: true, kemBits: 1024},
	X25519MLKEM1024:  {name: X25519MLKEM1024, pattern: hybrid, kemBits: 1024},
}

var legacyAliases = map[string]spec{
	"kyber768":         {name: "kyber768", pattern: postQuantum, fips: true, kemBits: 768, legacyOf: MLKEM768},
	"kyber1024":        {name: "kyber1024", pattern: postQuantum, fips: true, kemBits: 1024, legacyOf: MLKEM1024},
	"x25519-kyber1024": {name: "x25519-kyber1024", pattern: hybrid, kemBits: 1024, legacyOf: X25519MLKEM1024},
}

var deprecated = map[string][2]string{
	"aes-128-gcm": {"128-bit key is below the 256-bit minimum", AES256GCM},
	"aes-128":     {"128-bit key is below the 256-bit minimum", AES256GCM},
	"aes-128-cbc": {"128-bit key and unauthenticated mode", AES256GCM},
	"aes-128-ctr": {"128-bit key and unauthenticated mode", AES256GCM},
	"3des":        {"64-bit block, weak and slow", AES256GCM}, "tripledes": {"64-bit block, weak and slow", AES256GCM},
	"des-ede3": {"64-bit block, weak and slow", AES256GCM}, "des-ede3-cbc": {"64-bit block, weak and slow", AES256GCM},
	"des": {"56-bit key, completely broken", AES256GCM}, "des-cbc": {"56-bit key, completely broken", AES256GCM},
	"rc4": {"biased keystream, multiple practical attacks", ChaCha20Poly1305}, "arcfour": {"biased keystream, multiple practical attacks", ChaCha20Poly1305},
	"md5": {"cryptographically broken hash", "sha-256"}, "sha-1": {"practical collision attacks", "sha-256"},
	"sha1": {"practical collision attacks", "sha-256"}, "rsa-oaep-sha1": {"OAEP with SHA-1", RSAOAEP4096},
}

var rsaBits = regexp.MustCompile(`^rsa(?:-oaep)?-?(\d{3,5})(?:$|-)`)

// Normalize is an algorithm name's canonical spelling: lower case, hyphens, no blanks.
func Normalize(name string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimSpace(name)), "_", "-")
}

func algErr(what, hint string) error {
	return prismerr.New("algorithm_not_allowed", what, hint).At("security.encryption.algorithm")
}

// lookup resolves a name; legacy RFC-031 spellings resolve only when decrypting.
func lookup(name string, decrypt bool) (spec, error) {
	n := Normalize(name)
	if n == "" {
		return spec{}, algErr("no encryption algorithm given", "use aes-256-gcm, ml-kem-1024 or x25519-ml-kem-1024")
	}
	if d, ok := deprecated[n]; ok {
		return spec{}, algErr("algorithm "+quote(name)+" is deprecated: "+d[0], "use "+d[1]+" instead")
	}
	if m := rsaBits.FindStringSubmatch(n); m != nil {
		if bits, _ := strconv.Atoi(m[1]); bits < 3072 {
			return spec{}, algErr("algorithm "+quote(name)+" is deprecated: RSA-"+m[1]+" is insufficient for 2025 and later (minimum 3072 bits)", "use rsa-oaep-4096 instead")
		}
	}
	if s, ok := approved[n]; ok {
		return s, nil
	}
	if s, ok := legacyAliases[n]; ok {
		if decrypt {
			return s, nil
		}
		return spec{}, algErr("algorithm "+quote(name)+" is a legacy RFC-031 spelling, accepted on decrypt only", "encrypt with "+s.legacyOf)
	}
	return spec{}, algErr("algorithm "+quote(name)+" is not supported for payload encryption", "use aes-256-gcm, ml-kem-1024 or x25519-ml-kem-1024")
}

// Policy says which algorithms a producer may write and a consumer may read. FIPSMode admits
// only FIPS 140-3 approved algorithms (not ChaCha20-Poly1305, not the X25519 hybrid);
// Allowlist, when not empty, narrows further (canonical names).
type Policy struct {
	FIPSMode  bool
	Allowlist []string
}

func (p Policy) check(name string, decrypt bool) (spec, error) {
	s, err := lookup(name, decrypt)
	if err != nil {
		return s, err
	}
	canonical := s.name
	if s.legacyOf != "" {
		canonical = s.legacyOf
	}
	if p.FIPSMode && !s.fips {
		return spec{}, algErr("algorithm "+quote(name)+" is not FIPS 140-3 approved and the policy is in FIPS mode", "use aes-256-gcm or ml-kem-1024")
	}
	if len(p.Allowlist) > 0 {
		for _, a := range p.Allowlist {
			if Normalize(a) == canonical {
				return s, nil
			}
		}
		return spec{}, algErr("algorithm "+quote(name)+" is not in the policy's allowlist", "use one of "+strings.Join(p.Allowlist, ", "))
	}
	return s, nil
}
