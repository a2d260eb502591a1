//! TypeScript cells (ADR 0043): a TypeScript context is a JavaScript context whose cells
//! are turned into JavaScript here, on the host, before its driver (`driver.js`) gets them.
//! oxc parses the cell as TypeScript (a script, or a module when it has `import`, `export`
//! or top-level `await`), checks it, strips its types and lowers what TypeScript adds to
//! JavaScript (enums, namespaces, parameter properties), and prints JavaScript that the
//! driver runs as it runs a JavaScript cell: ESM imports, top-level `await`, the last
//! expression as the cell's value and the state kept for the next cell all work the same.
//! A cell oxc refuses never reaches the interpreter: its first error is the cell's
//! `SyntaxError`, with the line and column in the traceback.

use std::path::Path;

use oxc_allocator::Allocator;
use oxc_ast::ast::Statement;
use oxc_codegen::Codegen;
use oxc_diagnostics::{OxcDiagnostic, Severity};
use oxc_parser::Parser;
use oxc_semantic::SemanticBuilder;
use oxc_span::SourceType;
use oxc_transformer::{TransformOptions, Transformer, TypeScriptOptions};

use crate::model::CellError;

/// The name a cell's position is given under in its error, as the driver names a
/// JavaScript cell `<cell N>`.
const CELL_NAME: &str = "<typescript cell>";

/// The most a TypeScript cell may be. With [`MAX_NESTING`] and [`TRANSLATE_STACK`] it bounds
/// what one tenant's cell can make the server do: oxc's parser, checker and printer recurse
/// once per level of nesting, without a limit of their own, and a cell of 131,072 nested
/// `(` overflowed a 64 MiB stack (a stack overflow aborts the whole server), while 131,072
/// nested `{` took 225 s to check (debug build; ADR 0043).
const MAX_CELL_BYTES: usize = 256 << 10;

/// The deepest brackets (`(`, `[`, `{`, `${`) may nest in a TypeScript cell's code; far more
/// than code written by hand or by a model nests.
const MAX_NESTING: usize = 256;

/// The stack of the thread a cell is translated on: every nesting form that is not a bracket
/// (`!!x`, `a = b = c`, `a ? b : c ? ...`, `else if` chains, `A<A<...>>`) fitted 256 KiB of
/// itself in 512 MiB in a debug build (at most 2 kB of stack per byte of cell; a release
/// build's frames are smaller). Only the pages used are ever touched.
const TRANSLATE_STACK: usize = 512 << 20;

/// The JavaScript for TypeScript cell `source`, or the error that stops it: refused when it
/// is larger or nests deeper than a cell is let to, else translated on a thread of its own
/// with a stack large enough for any cell of that size.
pub(super) fn to_javascript(source: &str) -> Result<String, CellError> {
    within_bounds(source)?;
    let owned = source.to_owned();
    let translated = std::thread::Builder::new()
        .name("typescript-cell".into())
        .stack_size(TRANSLATE_STACK)
        .spawn(move || translate(&owned));
    match translated.map(std::thread::JoinHandle::join) {
        Ok(Ok(done)) => done,
        Ok(Err(_)) => Err(not_translated("the translation failed")),
        Err(e) => Err(not_translated(&format!(
            "no thread to translate it on ({e}); run the cell again"
        ))),
    }
}

/// A cell that could not be translated for a reason of the server's, not the cell's.
fn not_translated(why: &str) -> CellError {
    CellError {
        name: "Error".into(),
        value: format!("the TypeScript cell was not run: {why}"),
        traceback: String::new(),
    }
}

/// Refuses a cell over [`MAX_CELL_BYTES`], or whose brackets nest deeper than
/// [`MAX_NESTING`], as its `SyntaxError`, before any parser sees it. Brackets are counted in
/// the cell's code only: strings, template text, comments and regular expressions are
/// skipped (a `)` in a string cannot hide an open bracket). What this lexer takes for a
/// regular expression where the parser sees a division is the one way it can miscount;
/// the thread's stack covers a miscounted cell of this size all the same.
fn within_bounds(source: &str) -> Result<(), CellError> {
    if source.len() > MAX_CELL_BYTES {
        return Err(error_at(
            source,
            floor_char(source, MAX_CELL_BYTES),
            &format!(
                "a TypeScript cell is at most {} KiB; split it into several cells, or run it \
                 in a JavaScript context",
                MAX_CELL_BYTES >> 10
            ),
            0,
        ));
    }
    match deepest_at(source.as_bytes()) {
        Some(at) => Err(error_at(
            source,
            floor_char(source, at),
            &format!("brackets nest deeper than {MAX_NESTING} levels here"),
            1,
        )),
        None => Ok(()),
    }
}

/// Where the brackets of `code` first nest deeper than [`MAX_NESTING`], if they do.
fn deepest_at(code: &[u8]) -> Option<usize> {
    // The bracket depth at which each open template literal's `${` began.
    let mut templates: Vec<usize> = Vec::new();
    let mut depth = 0usize;
    // The last byte of code that was not a space: says whether `/` starts a regex.
    let mut last = b'(';
    let mut i = 0;
    let skip_to = |from: usize, end: &[u8]| {
        code[from..]
            .windows(end.len())
            .position(|w| w == end)
            .map_or(code.len(), |p| from + p + end.len())
    };
    // The end of a quoted run from `from` (after its opening quote) to `quote`; a template's
    // run also ends after a `${` (then `true`).
    let quoted = |mut at: usize, quote: u8| -> (usize, bool) {
        while at < code.len() {
            match code[at] {
                b'\\' => at += 2,
                c if c == quote => return (at + 1, false),
                b'$' if quote == b'`' && code.get(at + 1) == Some(&b'{') => return (at + 2, true),
                b'\n' if quote != b'`' => return (at + 1, false),
                _ => at += 1,
            }
        }
        (code.len(), false)
    };
    while i < code.len() {
        let c = code[i];
        match c {
            b'/' if code.get(i + 1) == Some(&b'/') => i = skip_to(i, b"\n"),
            b'/' if code.get(i + 1) == Some(&b'*') => i = skip_to(i + 2, b"*/"),
            b'/' if b"(,=:[!&|?{};+-*%<>~^".contains(&last) => {
                // A regular expression: to its closing `/` (a class `[...]` may hold one).
                let mut at = i + 1;
                let mut class = false;
                while at < code.len() && code[at] != b'\n' {
                    match code[at] {
                        b'\\' => at += 1,
                        b'[' => class = true,
                        b']' => class = false,
                        b'/' if !class => break,
                        _ => {}
                    }
                    at += 1;
                }
                i = at + 1;
                last = b'a';
            }
            b'\'' | b'"' | b'`' => {
                let (end, opened) = quoted(i + 1, c);
                i = end;
                last = b'a';
                if opened {
                    templates.push(depth);
                    depth += 1;
                    if depth > MAX_NESTING {
                        return Some(i - 2);
                    }
                    last = b'{';
                }
            }
            b'(' | b'[' | b'{' => {
                depth += 1;
                if depth > MAX_NESTING {
                    return Some(i);
                }
                last = c;
                i += 1;
            }
            b')' | b']' | b'}' => {
                depth = depth.saturating_sub(1);
                i += 1;
                last = c;
                // The `}` that closes a template's `${`: its text goes on.
                if c == b'}' && templates.last() == Some(&depth) {
                    templates.pop();
                    let (end, opened) = quoted(i, b'`');
                    i = end;
                    last = b'a';
                    if opened {
                        templates.push(depth);
                        depth += 1;
                        last = b'{';
                    }
                }
            }
            b' ' | b'\t' | b'\r' | b'\n' => i += 1,
            _ => {
                last = c;
                i += 1;
            }
        }
    }
    None
}

/// [`to_javascript`]'s work, on its own thread.
fn translate(source: &str) -> Result<String, CellError> {
    let alloc = Allocator::default();
    let parsed = Parser::new(&alloc, source, SourceType::ts()).parse();
    refuse(source, &parsed.diagnostics)?;
    if parsed.panicked {
        return Err(error_at(
            source,
            0,
            "the cell could not be parsed as TypeScript",
            0,
        ));
    }
    let mut program = parsed.program;
    let checked = SemanticBuilder::new_compiler()
        .with_enum_eval(true)
        .build(&program);
    refuse(source, &checked.diagnostics)?;
    let options = TransformOptions {
        typescript: TypeScriptOptions {
            // An import the cell does not use may be for the cells after it: only
            // `import type` (and `type` specifiers) go.
            only_remove_type_imports: true,
            ..TypeScriptOptions::default()
        },
        ..TransformOptions::default()
    };
    let done = Transformer::new(&alloc, Path::new("cell.ts"), &options)
        .build_with_scoping(checked.semantic.into_scoping(), &mut program);
    refuse(source, &done.diagnostics)?;
    // A module whose imports were all types gets an `export {}` to stay a module; the
    // driver runs a cell as a script or as an async function, where it cannot stand.
    program
        .body
        .retain(|s| !matches!(s, Statement::ExportNamedDeclaration(e) if e.specifiers.is_empty()));
    Ok(Codegen::new().build(&program).code)
}

/// The first error among `diagnostics` (warnings pass), as the cell's error.
fn refuse<'d>(
    source: &str,
    diagnostics: impl IntoIterator<Item = &'d OxcDiagnostic>,
) -> Result<(), CellError> {
    let errors: Vec<&OxcDiagnostic> = diagnostics
        .into_iter()
        .filter(|d| d.severity == Severity::Error)
        .collect();
    let Some(first) = errors.first() else {
        return Ok(());
    };
    let label = first
        .labels
        .iter()
        .find(|l| l.primary())
        .or_else(|| first.labels.first());
    let offset = label.map_or(0, |l| l.offset() as usize);
    let width = label.map_or(0, |l| l.len() as usize);
    let mut e = error_at(source, offset, &first.message, width);
    if let Some(help) = &first.help {
        e.traceback.push_str(&format!("\n{help}"));
    }
    if errors.len() > 1 {
        e.traceback.push_str(&format!(
            "\n({} more errors after this one)",
            errors.len() - 1
        ));
    }
    Err(e)
}

/// A `SyntaxError` at byte `offset` of `source`: the traceback names the line and column
/// (1-based, in characters), shows the line and marks `width` bytes of it, as Node shows a
/// JavaScript cell's syntax error.
fn error_at(source: &str, offset: usize, message: &str, width: usize) -> CellError {
    let offset = floor_char(source, offset.min(source.len()));
    let start = source[..offset].rfind('\n').map_or(0, |i| i + 1);
    let end = source[offset..]
        .find('\n')
        .map_or(source.len(), |i| offset + i);
    let line_no = source[..offset].matches('\n').count() + 1;
    let col = source[start..offset].chars().count() + 1;
    let line = source[start..end].trim_end_matches('\r');
    let marked = floor_char(source, (offset + width).min(end));
    let carets = source[offset..marked].chars().count().max(1);
    // A long line is shown from at most 60 characters before the column, 60 after.
    let from = source[start..offset]
        .char_indices()
        .rev()
        .nth(59)
        .map_or(start, |(i, _)| start + i);
    let to = source[offset..end]
        .char_indices()
        .nth(60)
        .map_or(end, |(i, _)| offset + i);
    let (line, col_shown) = if from > start || to < end {
        (&source[from..to], source[from..offset].chars().count() + 1)
    } else {
        (line, col)
    };
    let carets = carets.min(line.chars().count().saturating_sub(col_shown - 1).max(1));
    CellError {
        name: "SyntaxError".into(),
        value: message.to_string(),
        traceback: format!(
            "{CELL_NAME}:{line_no}:{col}\n{line}\n{}{}\n\nSyntaxError: {message}",
            " ".repeat(col_shown - 1),
            "^".repeat(carets)
        ),
    }
}

/// `i`, moved back to the start of the character it falls in.
fn floor_char(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The attack: one tenant's cell of deeply nested brackets. The old code parsed it on
    /// the caller's stack and the stack overflow aborted the whole server (this test's
    /// process with it); it is now refused as the cell's SyntaxError before any parsing.
    #[test]
    fn a_cell_nested_past_the_limit_is_refused_before_it_is_parsed() {
        for (open, close) in [("(", ")"), ("[", "]"), ("{", "}"), ("`${", "}`")] {
            let cell = format!("{}1{}", open.repeat(50_000), close.repeat(50_000));
            let e = to_javascript(&cell).expect_err("a cell nested 50,000 deep ran");
            assert_eq!(e.name, "SyntaxError", "{}", e.value);
            assert!(e.value.contains("nest deeper than 256"), "{}", e.value);
        }
        // Closing brackets in strings, comments and regular expressions hide nothing.
        let hidden = "f(\")]}\", /* )]} */ ')]}', `)]}`, /[)]/, ".repeat(300);
        let cell = format!("{hidden}1{}", ")".repeat(300));
        let e = to_javascript(&cell).expect_err("the hidden nesting ran");
        assert!(e.value.contains("nest deeper"), "{}", e.value);
        // As deep as allowed is translated.
        let ok = format!("{}1{}", "(".repeat(256), ")".repeat(256));
        assert!(to_javascript(&ok).is_ok());
    }

    /// Nesting that is no bracket, as large as a cell may be, runs on the translation's own
    /// stack instead of overflowing the caller's (a test thread has 2 MiB).
    #[test]
    fn the_deepest_unbracketed_cell_is_translated_on_its_own_stack() {
        let not = format!("{}x", "!".repeat(MAX_CELL_BYTES - 1));
        assert!(to_javascript(&not).is_ok());
        let assign = format!("{}1", "a=".repeat(MAX_CELL_BYTES / 2 - 1));
        assert!(to_javascript(&assign).is_ok());
        let big = "1;".repeat(MAX_CELL_BYTES / 2 + 1);
        let e = to_javascript(&big).expect_err("an oversized cell ran");
        assert!(e.value.contains("at most 256 KiB"), "{}", e.value);
        assert!(
            e.traceback.len() < 400,
            "the whole cell came back in its error"
        );
    }

    #[test]
    fn strings_templates_and_regexes_with_brackets_are_not_nesting() {
        let cell = "const r = /[(]+\\)/g; const s = \"((((\"; // ((((\n\
             const t = `a ${ (1 + 2) } b ${ `x ${ [1].map((x) => ({ x })) }` } ((`;\n\
             const d = 4 / 2 / (1); console.log(r, s, t, d);";
        assert_eq!(deepest_at(cell.as_bytes()), None);
        let out = js(cell);
        assert!(out.contains("console.log(r, s, t, d)"), "{out}");
    }

    fn js(ts: &str) -> String {
        match to_javascript(ts) {
            Ok(js) => js,
            Err(e) => panic!("{ts:?} refused: {e:?}"),
        }
    }

    #[test]
    fn types_interfaces_and_generics_go_and_the_code_stays() {
        let out = js("interface P { x: number }\n\
             function first<T>(xs: T[]): T { return xs[0]; }\n\
             const p: P = { x: first<number>([41]) + 1 };\n\
             console.log(p.x as number);");
        assert!(!out.contains("interface"), "{out}");
        assert!(!out.contains(": number"), "{out}");
        assert!(!out.contains("<T>"), "{out}");
        assert!(out.contains("function first(xs)"), "{out}");
        assert!(out.contains("console.log(p.x)"), "{out}");
    }

    #[test]
    fn the_last_expression_stays_the_last_statement() {
        assert_eq!(js("process.cwd()").trim(), "process.cwd();");
    }

    #[test]
    fn enums_and_parameter_properties_become_javascript() {
        let out = js("enum Color { Red, Green = 5 }\n\
             class A { constructor(private n: number) {} }");
        assert!(out.contains("Color[Color[\"Green\"] = 5]"), "{out}");
        assert!(out.contains("this.n = n"), "{out}");
    }

    #[test]
    fn imports_stay_for_later_cells_but_type_imports_go() {
        let out = js("import fs from 'node:fs';\n\
             import type { Stats } from 'node:fs';\n\
             import { type Dirent, readdirSync } from 'node:fs';\n\
             const n: number = await Promise.resolve(1);");
        assert!(out.contains("import fs from \"node:fs\""), "{out}");
        assert!(
            out.contains("import { readdirSync } from \"node:fs\""),
            "{out}"
        );
        assert!(!out.contains("Stats") && !out.contains("Dirent"), "{out}");
        assert!(out.contains("await Promise.resolve(1)"), "{out}");
        assert!(!out.contains("export"), "{out}");
    }

    #[test]
    fn a_cell_of_types_only_is_empty() {
        assert_eq!(js("type A = { a: string };\ninterface B {}").trim(), "");
        assert_eq!(js("import type { A } from './a';").trim(), "");
        let out = js("import type { A } from './a';\nconst a: A = await Promise.resolve(1);");
        assert!(!out.contains("export"), "{out}");
    }

    #[test]
    fn a_script_cell_stays_a_script() {
        // Not a module (no import, export or top-level await): sloppy-mode JavaScript such
        // as a bare assignment to an undeclared name runs as the cell wrote it.
        let out = js("undeclared = 1 as number; var again: string = 'a'; var again = 'b';");
        assert!(out.contains("undeclared = 1;"), "{out}");
        assert!(!out.contains("export"), "{out}");
    }

    #[test]
    fn a_syntax_error_names_its_line_and_column() {
        let e = to_javascript("const a = 1;\nlet b: = 2;").expect_err("refused");
        assert_eq!(e.name, "SyntaxError");
        assert!(!e.value.is_empty());
        assert!(
            e.traceback
                .starts_with("<typescript cell>:2:8\nlet b: = 2;\n       ^"),
            "{}",
            e.traceback
        );
        assert!(e.traceback.contains(&format!("SyntaxError: {}", e.value)));
    }

    #[test]
    fn a_checked_error_is_refused_too() {
        let e = to_javascript("let x: number = 1;\nlet x = 2;").expect_err("refused");
        assert_eq!(e.name, "SyntaxError");
        assert!(e.value.contains('x'), "{e:?}");
        assert!(e.traceback.starts_with("<typescript cell>:"), "{e:?}");
    }

    /// Pieces of TypeScript (and of nonsense) a tenant's cell may hold, in any order.
    const PIECES: &[&str] = &[
        "let ",
        "const ",
        "x",
        ": ",
        "number",
        "<T>",
        "<",
        ">",
        "(",
        ")",
        "{",
        "}",
        "[",
        "]",
        "=>",
        "=",
        ";",
        "\n",
        ",",
        "interface ",
        "type ",
        "enum ",
        "namespace ",
        "class ",
        "implements ",
        "extends ",
        "import ",
        "export ",
        "from ",
        "'m'",
        "await ",
        "async ",
        "function ",
        "return ",
        "as ",
        "satisfies ",
        "?",
        "!",
        "@",
        "`${",
        "`",
        "/*",
        "*/",
        "//",
        "declare ",
        "abstract ",
        "private ",
        "readonly ",
        "keyof ",
        "typeof ",
        "infer ",
        "is ",
        "asserts ",
        "unique symbol",
        "|",
        "&",
        ".",
        "...",
        "1",
        "0x",
        "é",
        "\u{0}",
        "#p",
        "static ",
        "constructor",
        "get ",
        "set ",
        "new ",
        "this",
        "super",
        "yield ",
        "*",
        "module ",
        "global ",
        "require",
        "accessor ",
        "using ",
        "out ",
        "in ",
        "const",
    ];

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(2048))]

        /// Whatever a cell holds, oxc answers JavaScript or an error: it never panics
        /// (a panic would end the server, which aborts on panic in release builds).
        #[test]
        fn any_cell_is_translated_or_refused_never_a_panic(
            pieces in proptest::collection::vec(proptest::sample::select(PIECES), 0..40)
        ) {
            let cell = pieces.concat();
            if let Err(e) = to_javascript(&cell) {
                proptest::prop_assert_eq!(e.name, "SyntaxError");
                proptest::prop_assert!(e.traceback.starts_with("<typescript cell>:"));
            }
        }
    }

    #[test]
    fn positions_count_characters_and_never_split_one() {
        let e = error_at("é = ü:", 5, "bad", 99);
        assert!(
            e.traceback
                .starts_with("<typescript cell>:1:5\né = ü:\n    ^^"),
            "{e:?}"
        );
        let e = error_at("", 7, "empty", 0);
        assert!(
            e.traceback.starts_with("<typescript cell>:1:1\n\n^\n"),
            "{e:?}"
        );
    }
}
