// Package registry is a client for Prism's schema registry (docs/schema-registry.md): the
// Confluent-compatible routes (/subjects, /schemas/ids) and Prism's own (/v1/...). It
// resolves the schema an envelope names, validates payloads before they are published, and
// masks the PII fields a schema tags.
package registry

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/prism-envelope/prism/clients/go/prismerr"
)

// Client talks to one registry. The zero HTTP client is a 10-second-timeout one.
type Client struct {
	BaseURL     string
	HTTP        *http.Client
	Username    string // HTTP basic auth, with Password
	Password    string
	BearerToken string // or a bearer token (a JWT the registry checks against its JWKS)
	// MaxResponseBytes bounds what is read from the registry (default 8 MiB).
	MaxResponseBytes int64
}

// New returns a client for the registry at baseURL (e.g. http://registry:8081).
func New(baseURL string) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, prismerr.New("bad_config", "registry URL "+quote(baseURL)+" is not an http(s) URL", "e.g. http://127.0.0.1:8081").At("registry.New")
	}
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), HTTP: &http.Client{Timeout: 10 * time.Second}}, nil
}

func quote(s string) string { b, _ := json.Marshal(s); return string(b) }

// Error is what the registry answered with a non-2xx status: the Confluent error body
// {"error_code", "message"}. It unwraps to a *prismerr.Error with code schema_registry_error.
type Error struct {
	Status    int
	ErrorCode int    `json:"error_code"`
	Message   string `json:"message"`
}

func (e *Error) Error() string {
	return "registry answered " + strconv.Itoa(e.Status) + " (" + strconv.Itoa(e.ErrorCode) + "): " + e.Message
}

// NotFound reports a 404 answer (subject, version or schema not found).
func (e *Error) NotFound() bool { return e.Status == http.StatusNotFound }

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return prismerr.New("bad_config", "request body cannot be encoded: "+err.Error(), "")
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, rd)
	if err != nil {
		return prismerr.New("bad_config", "bad registry request: "+err.Error(), "")
	}
	req.Header.Set("Accept", "application/vnd.schemaregistry.v1+json, application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/vnd.schemaregistry.v1+json")
	}
	if c.BearerToken != "" {
		req.Header.Set("Authorization", "Bearer "+c.BearerToken)
	} else if c.Username != "" {
		req.SetBasicAuth(c.Username, c.Password)
	}
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: 10 * time.Second}
	}
	resp, err := hc.Do(req)
	if err != nil {
		return (&prismerr.Error{Code: "schema_registry_error", What: "registry " + c.BaseURL + " unreachable: " + err.Error(),
			Hint: "check the registry URL and that it runs"}).Wrap(err)
	}
	defer resp.Body.Close()
	limit := c.MaxResponseBytes
	if limit <= 0 {
		limit = 8 << 20
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return (&prismerr.Error{Code: "schema_registry_error", What: "reading the registry's answer failed: " + err.Error()}).Wrap(err)
	}
	if int64(len(raw)) > limit {
		return prismerr.Newf("schema_registry_error", "the registry's answer to %s %s is over %d bytes", method, path, limit)
	}
	if resp.StatusCode/100 != 2 {
		re := &Error{Status: resp.StatusCode}
		_ = json.Unmarshal(raw, re)
		if re.Message == "" {
			re.Message = strings.TrimSpace(string(raw[:min(len(raw), 200)]))
		}
		return (&prismerr.Error{Code: "schema_registry_error", What: method + " " + path + ": " + re.Error(), Path: path}).Wrap(re)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return (&prismerr.Error{Code: "schema_registry_error", What: "the registry's answer to " + method + " " + path + " is not the expected JSON: " + err.Error()}).Wrap(err)
		}
	}
	return nil
}

func esc(s string) string { return url.PathEscape(s) }

// Reference is a Confluent schema reference.
type Reference struct {
	Name    string `json:"name"`
	Subject string `json:"subject"`
	Version int    `json:"version"`
}

// Schema is one registered schema version (fields that a route does not return are zero).
type Schema struct {
	Subject    string         `json:"subject"`
	Version    int            `json:"version"`
	ID         int            `json:"id"`
	Text       string         `json:"schema"`
	SchemaType string         `json:"schemaType"` // Confluent: AVRO (empty), JSON, PROTOBUF
	Format     string         `json:"format"`     // Prism: json, avro, protobuf
	Hash       string         `json:"hash"`
	Namespace  string         `json:"namespace"`
	Label      string         `json:"label"`
	Metadata   map[string]any `json:"metadata"`
	References []Reference    `json:"references"`
	// URL is the Prism URL of the version, what an envelope's schema_url names.
	URL string `json:"-"`

	refs *resolved // what References resolve to (references.go)
}

// Kind is the schema's format in lower case: json, avro or protobuf.
func (s *Schema) Kind() string {
	if s.Format != "" {
		return strings.ToLower(s.Format)
	}
	switch strings.ToUpper(s.SchemaType) {
	case "JSON":
		return "json"
	case "PROTOBUF":
		return "protobuf"
	}
	return "avro"
}

// ---------------------------------------------------------------- Confluent routes

// Subjects lists the registered subjects (GET /subjects).
func (c *Client) Subjects(ctx context.Context) ([]string, error) {
	var out []string
	return out, c.do(ctx, http.MethodGet, "/subjects", nil, &out)
}

// Versions lists a subject's versions (GET /subjects/{s}/versions).
func (c *Client) Versions(ctx context.Context, subject string) ([]int, error) {
	var out []int
	return out, c.do(ctx, http.MethodGet, "/subjects/"+esc(subject)+"/versions", nil, &out)
}

// Version fetches one version ("latest" or a number) of a subject
// (GET /subjects/{s}/versions/{v}).
func (c *Client) Version(ctx context.Context, subject, version string) (*Schema, error) {
	out := &Schema{}
	if err := c.do(ctx, http.MethodGet, "/subjects/"+esc(subject)+"/versions/"+esc(version), nil, out); err != nil {
		return nil, err
	}
	return out, c.ResolveReferences(ctx, out)
}

// SchemaByID fetches a schema by its global id (GET /schemas/ids/{id}).
func (c *Client) SchemaByID(ctx context.Context, id int) (*Schema, error) {
	out := &Schema{ID: id}
	if err := c.do(ctx, http.MethodGet, "/schemas/ids/"+strconv.Itoa(id), nil, out); err != nil {
		return nil, err
	}
	return out, c.ResolveReferences(ctx, out)
}

// SubjectVersion names one subject version.
type SubjectVersion struct {
	Subject string `json:"subject"`
	Version int    `json:"version"`
}

// SubjectsOfID lists the subject versions that hold a schema id (GET /schemas/ids/{id}/versions).
func (c *Client) SubjectsOfID(ctx context.Context, id int) ([]SubjectVersion, error) {
	var out []SubjectVersion
	return out, c.do(ctx, http.MethodGet, "/schemas/ids/"+strconv.Itoa(id)+"/versions", nil, &out)
}

// Register registers a schema under a subject (POST /subjects/{s}/versions) and returns its id.
// schemaType is AVRO, JSON or PROTOBUF.
func (c *Client) Register(ctx context.Context, subject, schema, schemaType string, refs ...Reference) (int, error) {
	body := map[string]any{"schema": schema, "schemaType": schemaType}
	if len(refs) > 0 {
		body["references"] = refs
	}
	var out struct {
		ID int `json:"id"`
	}
	return out.ID, c.do(ctx, http.MethodPost, "/subjects/"+esc(subject)+"/versions", body, &out)
}

// ---------------------------------------------------------------- Prism routes

// PrismVersion fetches a version with Prism's extra fields: hash, namespace, label and
// metadata (pii_fields) (GET /v1/subjects/{s}/versions/{v}).
func (c *Client) PrismVersion(ctx context.Context, subject, version string) (*Schema, error) {
	out := &Schema{}
	if err := c.do(ctx, http.MethodGet, "/v1/subjects/"+esc(subject)+"/versions/"+esc(version), nil, out); err != nil {
		return nil, err
	}
	out.URL = c.BaseURL + "/v1/subjects/" + esc(out.Subject) + "/versions/" + strconv.Itoa(out.Version)
	return out, c.ResolveReferences(ctx, out)
}

// PrismSchema fetches a schema by id with its hash and format (GET /v1/schemas/{id}).
func (c *Client) PrismSchema(ctx context.Context, id int) (*Schema, error) {
	out := &Schema{}
	if err := c.do(ctx, http.MethodGet, "/v1/schemas/"+strconv.Itoa(id), nil, out); err != nil {
		return nil, err
	}
	// /v1/schemas/{id} does not list references; the Confluent route does.
	var refs struct {
		References []Reference `json:"references"`
	}
	if err := c.do(ctx, http.MethodGet, "/schemas/ids/"+strconv.Itoa(id), nil, &refs); err != nil {
		return nil, err
	}
	out.References = refs.References
	return out, c.ResolveReferences(ctx, out)
}

// Registration is a POST /v1/schemas request (RFC-030).
type Registration struct {
	Namespace string         `json:"namespace,omitempty"`
	Topic     string         `json:"topic"`
	Version   string         `json:"version,omitempty"` // a label such as "v2"
	Format    string         `json:"format"`            // protobuf, json, avro
	Schema    string         `json:"schema"`
	Metadata  map[string]any `json:"metadata,omitempty"`
	DryRun    bool           `json:"dry_run,omitempty"`
}

// Registered is the answer to a registration: ids, the version's URL, the compatibility
// verdict and the PII fields the registry found.
type Registered struct {
	SchemaID   string   `json:"schema_id"`
	ID         int      `json:"id"`
	Subject    string   `json:"subject"`
	Version    int      `json:"version"`
	Hash       string   `json:"hash"`
	Created    bool     `json:"created"`
	SchemaURL  string   `json:"schema_url"`
	PIIFields  []string `json:"pii_fields"`
	Validation struct {
		IsCompatible    bool             `json:"is_compatible"`
		Mode            string           `json:"mode"`
		BreakingChanges []map[string]any `json:"breaking_changes"`
		Warnings        []map[string]any `json:"warnings"`
	} `json:"validation"`
}

// RegisterPrism registers through Prism's own route (POST /v1/schemas).
func (c *Client) RegisterPrism(ctx context.Context, r Registration) (*Registered, error) {
	out := &Registered{}
	return out, c.do(ctx, http.MethodPost, "/v1/schemas", r, out)
}

// Policy is a namespace's effective policy (GET /v1/policies/{namespace}).
type Policy struct {
	Compatibility    string `json:"compatibility"`
	PIIPolicy        string `json:"pii_policy"`
	ApprovalRequired bool   `json:"approval_required"`
	RequireSchema    bool   `json:"require_schema"`
	RequirePIITags   bool   `json:"require_pii_tags"`
	Source           string `json:"source"`
}

// PolicyOf fetches a namespace's policy.
func (c *Client) PolicyOf(ctx context.Context, namespace string) (*Policy, error) {
	out := &Policy{}
	return out, c.do(ctx, http.MethodGet, "/v1/policies/"+esc(namespace), nil, out)
}
