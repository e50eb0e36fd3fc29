package registry

import (
	"container/list"
	"context"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/prismerr"
)

// SchemaIDExtension is the envelope extension that carries a Confluent schema id.
const SchemaIDExtension = "schema.id"

var (
	subjectVersionRE = regexp.MustCompile(`/subjects/([^/]+)/versions/(\d+)/?$`)
	schemaIDRE       = regexp.MustCompile(`/(?:v1/schemas|schemas/ids)/(\d+)/?$`)
)

// Ref is what an envelope's schema context points at: a subject version, or a schema id.
type Ref struct {
	Subject  string
	Version  int
	SchemaID int
	Hash     string
}

func refErr(what, path, hint string) error {
	return prismerr.New("schema_reference_invalid", what, hint).At(path)
}

// RefOf reads the schema reference of an envelope: schema_url's path (only the path: a
// producer-controlled URL never makes the consumer call another host) names
// .../subjects/{s}/versions/{n} or .../schemas/ids/{id} (/v1/schemas/{id}); else the
// schema.id extension names an id.
func RefOf(env *envelope.Envelope) (Ref, error) {
	sc := env.Header.GetSchema()
	raw, hash := sc.GetSchemaUrl(), sc.GetSchemaHash()
	path := raw
	if strings.Contains(raw, "://") {
		if u, err := url.Parse(raw); err == nil {
			path = u.EscapedPath()
		}
	}
	if m := subjectVersionRE.FindStringSubmatch(path); m != nil {
		subject, err := url.PathUnescape(m[1])
		v, err2 := strconv.Atoi(m[2])
		if err == nil && err2 == nil {
			return Ref{Subject: subject, Version: v, Hash: hash}, nil
		}
	}
	text := ""
	if m := schemaIDRE.FindStringSubmatch(path); m != nil {
		text = m[1]
	} else if b, ok := env.Header.GetExtensions()[SchemaIDExtension]; ok {
		text = strings.TrimSpace(string(b))
	}
	if id, err := strconv.Atoi(text); err == nil && id > 0 && id < 1<<31 {
		return Ref{SchemaID: id, Hash: hash}, nil
	}
	return Ref{}, refErr("message "+env.Header.GetMetadata().GetMessageId()+" names no registered schema (schema_url "+quote(clip(raw))+")",
		"schema.schema_url", "the producer or the worker's enrich stage must stamp a registry schema (subject version or id)")
}

func clip(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}

// Resolver turns envelope schema references into schemas, checked and cached.
//
// What a reference may not do, because the envelope is producer-controlled: borrow another
// subject's schema (the subject must be the topic, <topic>-value, or one of Subjects), swap
// the content (a schema_hash must be the fetched version's), or flood the registry (a
// failed reference is remembered for NegativeTTL). Versions never change, so successes are
// kept until evicted (LRU, MaxEntries).
type Resolver struct {
	Client      *Client
	MaxEntries  int           // default 256
	NegativeTTL time.Duration // default 30 s

	mu    sync.Mutex
	items map[string]*list.Element
	order *list.List
	fails map[string]failure
}

type failure struct {
	until time.Time
	err   error
}

type entry struct {
	key    string
	schema *Schema
	under  []SubjectVersion
}

// NewResolver returns a resolver over client.
func NewResolver(c *Client) *Resolver {
	return &Resolver{Client: c, MaxEntries: 256, NegativeTTL: 30 * time.Second}
}

func (r *Resolver) cached(ctx context.Context, key string, fetch func() (*Schema, []SubjectVersion, error)) (*Schema, []SubjectVersion, error) {
	r.mu.Lock()
	if r.items == nil {
		r.items, r.order, r.fails = map[string]*list.Element{}, list.New(), map[string]failure{}
	}
	if el, ok := r.items[key]; ok {
		r.order.MoveToFront(el)
		e := el.Value.(*entry)
		r.mu.Unlock()
		return e.schema, e.under, nil
	}
	if f, ok := r.fails[key]; ok && time.Now().Before(f.until) {
		r.mu.Unlock()
		return nil, nil, f.err
	}
	r.mu.Unlock()
	s, under, err := fetch()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		ttl := r.NegativeTTL
		if ttl == 0 {
			ttl = 30 * time.Second
		}
		if len(r.fails) > 4096 {
			r.fails = map[string]failure{}
		}
		r.fails[key] = failure{time.Now().Add(ttl), err}
		return nil, nil, err
	}
	r.items[key] = r.order.PushFront(&entry{key, s, under})
	max := r.MaxEntries
	if max <= 0 {
		max = 256
	}
	for r.order.Len() > max {
		last := r.order.Back()
		r.order.Remove(last)
		delete(r.items, last.Value.(*entry).key)
	}
	return s, under, nil
}

// ForEnvelope returns the schema env references, after the checks above. subjects are the
// subjects the consumer accepts (default: the topic and <topic>-value).
func (r *Resolver) ForEnvelope(ctx context.Context, env *envelope.Envelope, subjects ...string) (*Schema, error) {
	ref, err := RefOf(env)
	if err != nil {
		return nil, err
	}
	topic := env.Header.GetMetadata().GetTopic()
	if len(subjects) == 0 {
		subjects = []string{topic, topic + "-value"}
	}
	allowed := func(s string) bool {
		for _, a := range subjects {
			if a == s {
				return true
			}
		}
		return false
	}
	id := env.Header.GetMetadata().GetMessageId()
	var s *Schema
	if ref.Subject != "" {
		if !allowed(ref.Subject) {
			return nil, refErr("message "+id+" on topic "+quote(topic)+" references subject "+quote(clip(ref.Subject))+", not one of "+strings.Join(subjects, ", "),
				"schema.schema_url", "a message may only be decoded by its own topic's schema; pass the subject if the topic's subject has another name")
		}
		s, _, err = r.cached(ctx, "sv\x00"+ref.Subject+"\x00"+strconv.Itoa(ref.Version), func() (*Schema, []SubjectVersion, error) {
			s, err := r.Client.PrismVersion(ctx, ref.Subject, strconv.Itoa(ref.Version))
			if err != nil {
				return nil, nil, refErr("schema "+quote(ref.Subject)+" version "+strconv.Itoa(ref.Version)+" cannot be read from the registry: "+err.Error(), "schema.schema_url", "")
			}
			return s, nil, nil
		})
	} else {
		var under []SubjectVersion
		s, under, err = r.cached(ctx, "id\x00"+strconv.Itoa(ref.SchemaID), func() (*Schema, []SubjectVersion, error) {
			s, err := r.Client.PrismSchema(ctx, ref.SchemaID)
			if err == nil {
				var u []SubjectVersion
				if u, err = r.Client.SubjectsOfID(ctx, ref.SchemaID); err == nil {
					if len(u) > 0 {
						s.Subject, s.Version = u[0].Subject, u[0].Version
					}
					return s, u, nil
				}
			}
			return nil, nil, refErr("schema id "+strconv.Itoa(ref.SchemaID)+" cannot be read from the registry: "+err.Error(), "schema.schema_url", "")
		})
		if err == nil {
			ok := false
			for _, sv := range under {
				ok = ok || allowed(sv.Subject)
			}
			if !ok {
				return nil, refErr("message "+id+" on topic "+quote(topic)+" references schema id "+strconv.Itoa(ref.SchemaID)+", which is not registered under "+strings.Join(subjects, ", "),
					"schema.schema_url", "pass the subject if the topic's subject has another name")
			}
		}
	}
	if err != nil {
		return nil, err
	}
	if th, ok := TextHash(s.Kind(), s.Text); ref.Hash != "" && ref.Hash != s.Hash && (!ok || ref.Hash != th) {
		return nil, refErr("message "+id+" claims schema hash "+quote(clip(ref.Hash))+", but the registry's schema hashes to "+s.Hash,
			"schema.schema_hash", "the envelope's schema context was altered, or names another registry's schema")
	}
	return s, nil
}
