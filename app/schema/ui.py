"""A one-page browser UI served by the registry at ``/ui``.

No build step and no framework: a static page that calls the ``/v1`` JSON API, so the UI
can never show something the API would not. It lists namespaces and subjects, a subject's
versions (with active consumers), the schema text, the PII fields, and the diff plus
compatibility verdict between two versions.

Three things this page once got wrong, each fixed where it came from: the verdict was labelled
"(FULL)" whatever the subject's compatibility (it now shows the mode the ``/v1`` diff checked,
the subject's configured one); Avro and JSON schemas were printed as stored, often one line
(they are indented now, :mod:`app.schema.pretty` on the server side); and every ``fetch`` failed
when the page was opened as ``https://user:password@host/ui`` (a relative URL resolves against
a base with credentials, which fetch refuses) - requests now go to ``location.origin``, which
never carries them, and the browser adds the credentials it authenticated with. The operator
console (:mod:`app.console`) is the full-featured successor.
"""

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Prism Schema Registry</title>
<style>
 body{font-family:system-ui,sans-serif;margin:0;display:flex;height:100vh}
 nav{width:280px;border-right:1px solid #ddd;overflow:auto;padding:8px}
 main{flex:1;overflow:auto;padding:12px}
 pre{background:#f6f8fa;padding:8px;overflow:auto}
 .ns{font-weight:bold;margin-top:8px} .subject{cursor:pointer;padding:2px 8px}
 .subject:hover{background:#eef} .breaking{color:#b00} .warning{color:#a60} .ok{color:#070}
 table{border-collapse:collapse} td,th{border:1px solid #ddd;padding:2px 6px}
</style></head>
<body>
<nav><h3>Namespaces</h3><div id="subjects">loading…</div></nav>
<main>
 <h2 id="title">Select a subject</h2>
 <div id="versions"></div>
 <div id="pii"></div>
 <div id="diffbox"></div>
 <pre id="schema"></pre>
</main>
<script>
const $ = (id) => document.getElementById(id);
const esc = (s) => String(s).replace(/[&<>"]/g, c => ({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c]));
const api = (path) => new URL(path, location.origin);  // never the credentials of the page's URL
const pretty = (fmt, text) => { if (fmt === 'PROTOBUF') return text;
  try { return JSON.stringify(JSON.parse(text), null, 2); } catch (e) { return text; } };
async function j(url){ const r = await fetch(api(url), {credentials: 'same-origin'}); if(!r.ok) throw new Error(url+': '+r.status); return r.json(); }
async function loadSubjects(){
  const subs = await j('/v1/subjects');
  const byNs = {};
  subs.forEach(s => (byNs[s.namespace] = byNs[s.namespace] || []).push(s));
  $('subjects').innerHTML = Object.keys(byNs).sort().map(ns =>
    `<div class="ns" data-ns="${esc(ns)}">${esc(ns)}</div>` + byNs[ns].map(s =>
      `<div class="subject" data-subject="${esc(s.subject)}">${esc(s.subject)} <small>v${s.latest_version} ${esc(s.format)}</small></div>`
    ).join('')).join('') || '<i>no subjects</i>';
  document.querySelectorAll('.subject').forEach(el => el.onclick = () => show(el.dataset.subject));
}
async function show(subject, version){
  const vs = await j(`/v1/subjects/${encodeURIComponent(subject)}/versions`);
  const v = version || vs[vs.length-1].version;
  $('title').textContent = subject;
  $('versions').innerHTML = '<table id="vtable"><tr><th>version</th><th>label</th><th>hash</th><th>consumers</th><th>created</th></tr>' +
    vs.map(x => `<tr class="vrow" data-version="${x.version}"><td><a href="#" data-v="${x.version}">v${x.version}</a></td><td>${esc(x.label||'')}</td>` +
      `<td><code>${esc(x.hash.slice(0,19))}…</code></td><td>${x.active_consumers}</td><td>${new Date(x.created_at*1000).toISOString()}</td></tr>`).join('') + '</table>';
  document.querySelectorAll('#vtable a').forEach(a => a.onclick = (e) => { e.preventDefault(); show(subject, +a.dataset.v); });
  const one = await j(`/v1/subjects/${encodeURIComponent(subject)}/versions/${v}`);
  $('schema').textContent = pretty(one.format, one.schema);
  const pii = (one.metadata && one.metadata.pii_fields) || [];
  $('pii').innerHTML = `<h3>PII fields (v${v})</h3><ul id="piilist">` + (pii.map(p => `<li>${esc(p)}</li>`).join('') || '<li><i>none</i></li>') + '</ul>';
  if (v > 1) {
    const d = await j(`/v1/subjects/${encodeURIComponent(subject)}/diff?from=${vs[0].version === v ? v : vs[vs.findIndex(x=>x.version===v)-1].version}&to=${v}`);
    const verdict = d.is_compatible ? `<span class="ok">compatible (${esc(d.mode)})</span>` : `<span class="breaking">breaking (${esc(d.mode)})</span>`;
    $('diffbox').innerHTML = `<h3>Diff v${d.from} → v${d.to}: <span id="verdict">${verdict}</span></h3>` +
      '<ul id="findings">' + d.breaking_changes.map(f => `<li class="breaking">${esc(f.path)}: ${esc(f.reason)}</li>`).join('') +
      d.warnings.map(f => `<li class="warning">${esc(f.path)}: ${esc(f.reason)}</li>`).join('') + '</ul>' +
      `<pre id="textdiff">${esc(d.text_diff)}</pre>`;
  } else { $('diffbox').innerHTML = ''; }
}
loadSubjects().catch(e => $('subjects').textContent = e);
</script></body></html>
"""
