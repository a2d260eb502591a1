//! Modules in layers (issue 50): inside every crate of the workspace, no two modules use each
//! other, directly or through others. Each crate target (its library and each of its
//! programs) is read with `syn` into a graph with one node per module file (`a.rs`,
//! `a/mod.rs`; an inline `mod x { }` belongs to the file it is written in) and an edge for
//! each path one file takes from another: `use crate::…`, `use super::…`, `use self::…`,
//! `use child::…`, and paths in code and in macro arguments that start with `crate::`,
//! `super::`, `self::` or a child module's name. A `mod x;` declaration is not an edge: a
//! parent declares its children without depending on them.
//!
//! A name is followed to the module that defines it: when `a` uses `crate::b::Thing` and
//! `b` only re-exports `Thing` (`pub use c::Thing;`, or any `use` of it, or a glob), the
//! edge goes from `a` to `c`. The dependency is on the code that defines `Thing`, and this
//! is what lets a parent `mod.rs` re-export its children's items for the rest of the crate
//! while the children import from one another through it, without that parent making a
//! loop. A name `b` takes from another crate (`use anyhow::Result;`) makes no edge.
//!
//! Test code may reach anywhere: items under `#[cfg(test)]` (or `cfg(all(test, …))`) are
//! left out, and so are tests/, benches/ and examples/. The strongly connected components
//! of the graph (Tarjan's, from `petgraph`) with more than one module are the loops; the
//! test fails naming each loop's modules and the lines that make its edges.
//!
//! Parsing with `syn` rather than by hand: `use` trees (groups, renames, `self`, globs),
//! `#[cfg(test)]` on any item, paths inside expressions, types and patterns, and items
//! nested in function bodies are what hand-written line matching gets wrong (the service's
//! older component test matches `super::` in text, and it held while 12 of its files were in
//! one loop through `crate::service::…` paths it did not look at).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use petgraph::algo::tarjan_scc;
use petgraph::graph::{DiGraph, NodeIndex};
use proc_macro2::{TokenStream, TokenTree};
use syn::punctuated::Punctuated;
use syn::visit::Visit;

/// A module's path from its crate's root (`[]` is the root).
type ModPath = Vec<String>;

/// One logical module: a file's, or an inline `mod x { }` inside one.
#[derive(Default)]
struct Module {
    /// The file it is written in, relative to the workspace.
    file: String,
    /// Its child modules by name.
    children: BTreeMap<String, ModPath>,
    /// Names of the items it defines.
    items: BTreeSet<String>,
    /// Names it takes with `use` (any visibility), to the path written.
    bindings: BTreeMap<String, Vec<String>>,
    /// Paths of its glob imports (`use x::*`).
    globs: Vec<Vec<String>>,
}

/// A path written somewhere, to be resolved once every module is known.
struct Ref {
    scope: ModPath,
    path: Vec<String>,
    line: usize,
}

/// One crate target's modules and the paths written in them.
#[derive(Default)]
struct Tree {
    modules: BTreeMap<ModPath, Module>,
    refs: Vec<Ref>,
    /// Files that could not be read or parsed (a failure of the test in itself).
    errors: Vec<String>,
}

/// An edge of the file graph and the lines that make it.
type Edges = BTreeMap<(String, String), BTreeSet<usize>>;

/// `#[cfg(test)]` or `#[cfg(all(…, test, …))]`: code only tests build.
fn test_only(attrs: &[syn::Attribute]) -> bool {
    fn is_test(meta: &syn::Meta) -> bool {
        match meta {
            syn::Meta::Path(p) => p.is_ident("test"),
            syn::Meta::List(l) if l.path.is_ident("all") => l
                .parse_args_with(Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated)
                .map(|m| m.iter().any(is_test))
                .unwrap_or(false),
            _ => false,
        }
    }
    attrs
        .iter()
        .any(|a| a.path().is_ident("cfg") && a.parse_args::<syn::Meta>().is_ok_and(|m| is_test(&m)))
}

/// `#[path = "…"]` on a `mod x;`.
fn path_attr(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find_map(|a| match &a.meta {
        syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

fn line_of(span: proc_macro2::Span) -> usize {
    span.start().line
}

/// The name an item defines, if it defines one a path can name.
fn item_name(item: &syn::Item) -> Option<String> {
    let ident = match item {
        syn::Item::Const(i) => &i.ident,
        syn::Item::Enum(i) => &i.ident,
        syn::Item::Fn(i) => &i.sig.ident,
        syn::Item::Static(i) => &i.ident,
        syn::Item::Struct(i) => &i.ident,
        syn::Item::Trait(i) => &i.ident,
        syn::Item::TraitAlias(i) => &i.ident,
        syn::Item::Type(i) => &i.ident,
        syn::Item::Union(i) => &i.ident,
        syn::Item::Macro(i) => i.ident.as_ref()?,
        _ => return None,
    };
    Some(ident.to_string())
}

/// A `use` tree flattened: each leaf's path, and the name it binds (`None` for a glob or `_`).
fn flatten(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<(Vec<String>, Leaf)>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            flatten(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => leaf(prefix, &n.ident, &n.ident, out),
        syn::UseTree::Rename(r) => leaf(prefix, &r.ident, &r.rename, out),
        syn::UseTree::Glob(_) => out.push((prefix.clone(), Leaf::Glob)),
        syn::UseTree::Group(g) => g.items.iter().for_each(|t| flatten(t, prefix, out)),
    }
}

enum Leaf {
    Name(String),
    Glob,
    Unnamed,
}

fn leaf(
    prefix: &[String],
    ident: &syn::Ident,
    bound: &syn::Ident,
    out: &mut Vec<(Vec<String>, Leaf)>,
) {
    let mut path = prefix.to_vec();
    let bound = if bound == "self" {
        prefix.last().cloned().unwrap_or_default()
    } else {
        bound.to_string()
    };
    if ident != "self" {
        path.push(ident.to_string());
    }
    let name = if bound == "_" {
        Leaf::Unnamed
    } else {
        Leaf::Name(bound)
    };
    out.push((path, name));
}

/// Collects the paths written in code (expressions, types, patterns, nested `use`s, macro
/// arguments), leaving out what only tests build.
struct Paths<'a> {
    scope: &'a ModPath,
    refs: &'a mut Vec<Ref>,
}

impl Paths<'_> {
    fn push(&mut self, path: Vec<String>, line: usize) {
        if path.len() >= 2 || matches!(path.first().map(String::as_str), Some("crate" | "super")) {
            self.refs.push(Ref {
                scope: self.scope.clone(),
                path,
                line,
            });
        }
    }

    /// Paths inside a macro's tokens: `a::b::c` sequences (`$crate::x` counts as `crate::x`).
    fn tokens(&mut self, tokens: TokenStream) {
        let tts: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < tts.len() {
            match &tts[i] {
                TokenTree::Group(g) => self.tokens(g.stream()),
                TokenTree::Ident(first) => {
                    let preceded =
                        i > 0 && matches!(&tts[i - 1], TokenTree::Punct(p) if p.as_char() == ':');
                    let mut path = vec![first.to_string()];
                    let mut j = i + 1;
                    while j + 2 < tts.len() + 1 {
                        match (&tts[j], tts.get(j + 1), tts.get(j + 2)) {
                            (
                                TokenTree::Punct(a),
                                Some(TokenTree::Punct(b)),
                                Some(TokenTree::Ident(id)),
                            ) if a.as_char() == ':' && b.as_char() == ':' => {
                                path.push(id.to_string());
                                j += 3;
                            }
                            _ => break,
                        }
                    }
                    if !preceded {
                        self.push(path, line_of(first.span()));
                    }
                    i = j;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
    }
}

impl<'ast> Visit<'ast> for Paths<'_> {
    fn visit_item(&mut self, i: &'ast syn::Item) {
        if test_only(item_attrs(i)) {
            return;
        }
        if let syn::Item::Use(u) = i {
            if u.leading_colon.is_none() {
                let mut leaves = Vec::new();
                flatten(&u.tree, &mut Vec::new(), &mut leaves);
                for (path, _) in leaves {
                    self.push(path, line_of(u.use_token.span));
                }
            }
            return;
        }
        syn::visit::visit_item(self, i);
    }

    fn visit_impl_item(&mut self, i: &'ast syn::ImplItem) {
        let attrs = match i {
            syn::ImplItem::Const(c) => &c.attrs,
            syn::ImplItem::Fn(f) => &f.attrs,
            syn::ImplItem::Type(t) => &t.attrs,
            syn::ImplItem::Macro(m) => &m.attrs,
            _ => return syn::visit::visit_impl_item(self, i),
        };
        if !test_only(attrs) {
            syn::visit::visit_impl_item(self, i);
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.leading_colon.is_none() {
            let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
            let line = p.segments.first().map_or(0, |s| line_of(s.ident.span()));
            self.push(segs, line);
        }
        syn::visit::visit_path(self, p);
    }

    /// `pub(crate)`, `pub(super)`, `pub(in …)`: who may see an item, not a use of anything.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.visit_path(&m.path);
        self.tokens(m.tokens.clone());
    }
}

fn item_attrs(i: &syn::Item) -> &[syn::Attribute] {
    match i {
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::ExternCrate(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::ForeignMod(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Macro(i) => &i.attrs,
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        syn::Item::TraitAlias(i) => &i.attrs,
        syn::Item::Type(i) => &i.attrs,
        syn::Item::Union(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

impl Tree {
    /// Reads a crate target from its root file.
    fn load(root_file: &Path, shown: &Path) -> Tree {
        let mut t = Tree::default();
        let dir = root_file.parent().unwrap().to_path_buf();
        t.file(root_file, shown, Vec::new(), dir);
        t
    }

    /// Reads one module file: `scope` is its module path, `dir` where its `mod x;` files are.
    fn file(&mut self, file: &Path, shown: &Path, scope: ModPath, dir: PathBuf) {
        let name = file
            .strip_prefix(shown)
            .unwrap_or(file)
            .display()
            .to_string();
        let parsed = std::fs::read_to_string(file)
            .map_err(|e| e.to_string())
            .and_then(|s| syn::parse_file(&s).map_err(|e| e.to_string()));
        match parsed {
            Ok(f) => self.items(&f.items, &name, shown, scope, &dir),
            Err(e) => self.errors.push(format!("{name}: {e}")),
        }
    }

    fn items(&mut self, items: &[syn::Item], file: &str, shown: &Path, scope: ModPath, dir: &Path) {
        self.modules.entry(scope.clone()).or_default().file = file.to_string();
        for item in items {
            if test_only(item_attrs(item)) {
                continue;
            }
            match item {
                syn::Item::Mod(m) => {
                    let name = m.ident.to_string();
                    let mut child = scope.clone();
                    child.push(name.clone());
                    self.module(&scope)
                        .children
                        .insert(name.clone(), child.clone());
                    if let Some((_, inner)) = &m.content {
                        self.items(inner, file, shown, child, &dir.join(&name));
                    } else {
                        let (path, child_dir) = match path_attr(&m.attrs) {
                            Some(p) => {
                                let p = dir.join(p);
                                let d = p.parent().unwrap().to_path_buf();
                                (p, d)
                            }
                            None => {
                                let flat = dir.join(format!("{name}.rs"));
                                if flat.exists() {
                                    (flat, dir.join(&name))
                                } else {
                                    (dir.join(&name).join("mod.rs"), dir.join(&name))
                                }
                            }
                        };
                        self.file(&path, shown, child, child_dir);
                    }
                }
                syn::Item::Use(u) => {
                    if u.leading_colon.is_some() {
                        continue;
                    }
                    let mut leaves = Vec::new();
                    flatten(&u.tree, &mut Vec::new(), &mut leaves);
                    for (path, leaf) in leaves {
                        match leaf {
                            Leaf::Name(n) => {
                                self.module(&scope).bindings.insert(n, path.clone());
                            }
                            Leaf::Glob => self.module(&scope).globs.push(path.clone()),
                            Leaf::Unnamed => {}
                        }
                        self.refs.push(Ref {
                            scope: scope.clone(),
                            path,
                            line: line_of(u.use_token.span),
                        });
                    }
                }
                other => {
                    if let Some(n) = item_name(other) {
                        self.module(&scope).items.insert(n);
                    }
                    let mut v = Paths {
                        scope: &scope,
                        refs: &mut self.refs,
                    };
                    v.visit_item(other);
                }
            }
        }
    }

    fn module(&mut self, scope: &ModPath) -> &mut Module {
        self.modules.entry(scope.clone()).or_default()
    }

    /// A path written in `scope` made absolute (from the crate root), or `None` when it
    /// starts outside the crate (another crate, the prelude, a local name).
    fn absolute(&self, scope: &ModPath, path: &[String]) -> Option<Vec<String>> {
        let first = path.first()?;
        let mut base = scope.clone();
        let mut rest = path;
        match first.as_str() {
            "crate" => {
                base.clear();
                rest = &path[1..];
            }
            "self" => rest = &path[1..],
            "super" => {
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop()?;
                    rest = &rest[1..];
                }
            }
            name => {
                let m = self.modules.get(scope)?;
                if !(m.children.contains_key(name)
                    || m.items.contains(name)
                    || m.bindings.contains_key(name))
                {
                    return None;
                }
            }
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }

    /// The module that defines what an absolute path names, following `use`s and globs;
    /// `None` when it comes from another crate.
    fn definer(&self, path: &[String], depth: usize) -> Option<ModPath> {
        let mut cur: ModPath = Vec::new();
        for (i, seg) in path.iter().enumerate() {
            let m = self.modules.get(&cur)?;
            if let Some(child) = m.children.get(seg) {
                cur = child.clone();
                continue;
            }
            if m.items.contains(seg) || depth > 16 {
                return Some(cur);
            }
            if let Some(target) = m.bindings.get(seg) {
                let mut full = self.absolute(&cur, target)?;
                full.extend(path[i + 1..].iter().cloned());
                return self.definer(&full, depth + 1);
            }
            for g in &m.globs {
                let Some(gabs) = self.absolute(&cur, g) else {
                    continue;
                };
                let Some(gm) = self.modules.get(&gabs) else {
                    continue;
                };
                if gm.children.contains_key(seg)
                    || gm.items.contains(seg)
                    || gm.bindings.contains_key(seg)
                {
                    let mut full = gabs;
                    full.extend(path[i..].iter().cloned());
                    return self.definer(&full, depth + 1);
                }
            }
            // A name this reading does not know (a macro, say): the module it is asked of.
            return Some(cur);
        }
        Some(cur)
    }

    /// The file graph's edges (self edges left out) with the lines that make them.
    fn edges(&self) -> Edges {
        let mut edges = Edges::new();
        for r in &self.refs {
            let Some(abs) = self.absolute(&r.scope, &r.path) else {
                continue;
            };
            let Some(def) = self.definer(&abs, 0) else {
                continue;
            };
            let from = &self.modules[&r.scope].file;
            let to = &self.modules[&def].file;
            if from != to {
                edges
                    .entry((from.clone(), to.clone()))
                    .or_default()
                    .insert(r.line);
            }
        }
        edges
    }
}

/// The edges inside one loop, with their lines.
type Inside<'a> = Vec<(&'a (String, String), &'a BTreeSet<usize>)>;

/// The loops of a file graph: each strongly connected component of more than one file, as
/// the files and the edges inside it.
fn loops(edges: &Edges) -> Vec<(Vec<String>, Inside<'_>)> {
    let mut g = DiGraph::<&str, ()>::new();
    let mut index: BTreeMap<&str, NodeIndex> = BTreeMap::new();
    for (from, to) in edges.keys() {
        for n in [from, to] {
            if !index.contains_key(n.as_str()) {
                index.insert(n, g.add_node(n));
            }
        }
        g.add_edge(index[from.as_str()], index[to.as_str()], ());
    }
    let mut out = Vec::new();
    for scc in tarjan_scc(&g) {
        if scc.len() < 2 {
            continue;
        }
        let mut files: Vec<String> = scc.iter().map(|n| g[*n].to_string()).collect();
        files.sort();
        let inside = edges
            .iter()
            .filter(|((f, t), _)| files.contains(f) && files.contains(t))
            .collect();
        out.push((files, inside));
    }
    out.sort();
    out
}

/// The root files of a crate's targets: its library and programs (not tests, benches,
/// examples or build scripts).
fn roots(krate: &Path) -> Vec<PathBuf> {
    let mut roots = BTreeSet::new();
    let src = krate.join("src");
    for f in ["lib.rs", "main.rs"] {
        if src.join(f).exists() {
            roots.insert(src.join(f));
        }
    }
    if let Ok(rd) = std::fs::read_dir(src.join("bin")) {
        for e in rd {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "rs") {
                roots.insert(p);
            }
        }
    }
    let manifest: toml::Table = std::fs::read_to_string(krate.join("Cargo.toml"))
        .unwrap()
        .parse()
        .unwrap();
    let lib = manifest.get("lib").into_iter();
    let bins = manifest
        .get("bin")
        .and_then(|b| b.as_array())
        .into_iter()
        .flatten();
    for t in lib.chain(bins) {
        if let Some(p) = t.get("path").and_then(|p| p.as_str()) {
            roots.insert(krate.join(p));
        }
    }
    roots.into_iter().collect()
}

/// Every loop of modules in the crates under `crates_dir`: its files, and it described for a
/// failure message (a file that cannot be read is one with no files).
fn find_loops(crates_dir: &Path, shown: &Path) -> Vec<(Vec<String>, String)> {
    let mut found = Vec::new();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(crates_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("Cargo.toml").exists())
        .collect();
    dirs.sort();
    for krate in dirs {
        for root in roots(&krate) {
            let tree = Tree::load(&root, shown);
            for e in &tree.errors {
                found.push((Vec::new(), format!("could not read {e}")));
            }
            for (files, edges) in loops(&tree.edges()) {
                let mut text = format!("a loop of {} modules: {}\n", files.len(), files.join(", "));
                for ((from, to), lines) in edges {
                    let source = std::fs::read_to_string(shown.join(from)).unwrap_or_default();
                    let src: Vec<&str> = source.lines().collect();
                    for l in lines.iter().take(3) {
                        let code = src.get(l.wrapping_sub(1)).map_or("", |s| s.trim());
                        text.push_str(&format!("    {from}:{l} -> {to}: {code}\n"));
                    }
                    if lines.len() > 3 {
                        text.push_str(&format!(
                            "    ({} more lines of {from} use {to})\n",
                            lines.len() - 3
                        ));
                    }
                }
                found.push((files, text));
            }
        }
    }
    found
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// The loops this test found when it was written that are not broken yet, each as its
/// files (issue 50). The list only shrinks: a loop not in it fails the test, and so does an
/// entry that no longer is a loop (take it out).
const KNOWN: &[&[&str]] = &[];

#[test]
fn no_crate_has_a_loop_of_modules() {
    let ws = workspace();
    let found = find_loops(&ws.join("crates"), &ws);
    let new: Vec<&str> = found
        .iter()
        .filter(|(files, _)| !KNOWN.iter().any(|k| k == files))
        .map(|(_, text)| text.as_str())
        .collect();
    assert!(
        new.is_empty(),
        "modules that use each other (move what both need down into a module both use; \
         see crates/cordon-testkit/tests/modules.rs):\n{}",
        new.join("\n")
    );
    let gone: Vec<&&[&str]> = KNOWN
        .iter()
        .filter(|k| !found.iter().any(|(files, _)| files == *k))
        .collect();
    assert!(
        gone.is_empty(),
        "no longer a loop: take these out of KNOWN in crates/cordon-testkit/tests/modules.rs: {gone:?}"
    );
}

/// Edges that would make no loop yet but break a layer the design names: `(from, to)`, the
/// target a file or a folder. The wire types are below the service that fills them.
const NEVER: &[(&str, &str)] = &[(
    "crates/cordon-server/src/model.rs",
    "crates/cordon-server/src/service/",
)];

#[test]
fn wire_types_never_use_the_service() {
    let ws = workspace();
    let tree = Tree::load(&ws.join("crates/cordon-server/src/lib.rs"), &ws);
    assert!(tree.errors.is_empty(), "{:?}", tree.errors);
    let edges = tree.edges();
    assert!(
        edges.keys().any(|(f, _)| f == NEVER[0].0),
        "the check reads nothing of {}",
        NEVER[0].0
    );
    let bad: Vec<_> = edges
        .iter()
        .filter(|((f, t), _)| NEVER.iter().any(|(a, b)| f == a && t.starts_with(b)))
        .collect();
    assert!(
        bad.is_empty(),
        "a layer used from below (move what both need into the lower one): {bad:?}"
    );
}

/// The reading itself, on a small crate written here: a loop through a `use` and a path in
/// code is found; a name re-exported by the root is followed to its definer; test code and
/// `mod` declarations make no edge.
#[test]
fn the_graph_finds_a_loop_and_follows_re_exports() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let src = root.join("crates/k/src");
    std::fs::create_dir_all(src.join("parent")).unwrap();
    std::fs::write(
        root.join("crates/k/Cargo.toml"),
        "[package]\nname = \"k\"\n",
    )
    .unwrap();
    let write = |f: &str, s: &str| std::fs::write(src.join(f), s).unwrap();
    write(
        "lib.rs",
        "mod a;\nmod b;\nmod parent;\nmod shared;\npub use shared::S;\n\
         pub fn root() { parent::child::f(); }\n",
    );
    write(
        "shared.rs",
        "pub struct S;\n#[cfg(test)]\nmod tests { use crate::a::A; }\n",
    );
    // The parent re-exports its child's item; the child uses the root's re-export of S.
    write("parent/mod.rs", "pub mod child;\npub use child::f;\n");
    write("parent/child.rs", "use crate::S;\npub fn f() -> S { S }\n");
    let loops_of = |root: &Path| -> Vec<String> {
        find_loops(&root.join("crates"), root)
            .into_iter()
            .map(|(_, text)| text)
            .collect()
    };
    // a and b do not yet use each other.
    write("a.rs", "use crate::b::B;\npub struct A;\n");
    write(
        "b.rs",
        "pub struct B;\nfn g() { let _ = format!(\"{}\", 1); }\n",
    );
    assert_eq!(loops_of(root), Vec::<String>::new());
    // b's code names a: a loop, found through a path in a macro's arguments.
    write(
        "b.rs",
        "pub struct B;\nfn g() { let _ = format!(\"{:?}\", super::a::A); }\n",
    );
    let found = loops_of(root);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("a loop of 2 modules: crates/k/src/a.rs, crates/k/src/b.rs"));
    assert!(found[0].contains("crates/k/src/a.rs:1 -> crates/k/src/b.rs: use crate::b::B;"));
    assert!(found[0].contains("crates/k/src/b.rs:2 -> crates/k/src/a.rs"));
    // The same edge in a plain expression, and the root's re-export taken by the child.
    write(
        "b.rs",
        "pub struct B;\nfn g() -> crate::a::A { super::a::A }\n",
    );
    assert_eq!(loops_of(root).len(), 1);
    // A child that takes what the root re-exports from its parent: a loop of root, child
    // (the root calls it) and... no: S is followed to shared.rs, so no loop with lib.rs.
    write("b.rs", "pub struct B;\n");
    assert_eq!(loops_of(root), Vec::<String>::new());
    // Without the re-export (S defined in the root itself), root and child are a loop.
    write(
        "lib.rs",
        "mod a;\nmod b;\nmod parent;\nmod shared;\npub struct S;\n\
         pub fn root() { parent::child::f(); }\n",
    );
    let found = loops_of(root);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("crates/k/src/lib.rs, crates/k/src/parent/child.rs"));
}
