; codekv anchors shared by JavaScript and TypeScript (compiled after each one's own file):
; calls, decorators, control flow, assignments and imports, whose nodes the two grammars name
; alike. Capture names: see codekv/grammars/__init__.py.

; -- calls and references -------------------------------------------------------------------
(call_expression
  function: [
    (identifier) @name
    (member_expression property: [(property_identifier) (private_property_identifier)] @name)
  ]) @call
(new_expression
  constructor: [
    (identifier) @name
    (member_expression property: (property_identifier) @name)
  ]) @call
(decorator [
  (identifier) @name
  (member_expression property: (property_identifier) @name)
  (call_expression function: [
    (identifier) @name
    (member_expression property: (property_identifier) @name)
  ])
]) @reference.decorator

; -- control flow ---------------------------------------------------------------------------
[
  (if_statement)
  (else_clause)
  (for_statement)
  (for_in_statement)
  (while_statement)
  (do_statement)
  (try_statement)
  (catch_clause)
  (finally_clause)
  (switch_statement)
  (switch_case)
  (switch_default)
  (ternary_expression)
] @branch

[
  (return_statement)
  (throw_statement)
  (yield_expression)
] @return

; -- assignments ----------------------------------------------------------------------------
(assignment_expression left: [
  (identifier) @name
  (member_expression property: [(property_identifier) (private_property_identifier)] @name)
  (array_pattern (identifier) @name)
  (object_pattern [
    (shorthand_property_identifier_pattern) @name
    (pair_pattern value: (identifier) @name)
  ])
]) @assign
(augmented_assignment_expression left: [
  (identifier) @name
  (member_expression property: [(property_identifier) (private_property_identifier)] @name)
]) @assign
(update_expression argument: [
  (identifier) @name
  (member_expression property: [(property_identifier) (private_property_identifier)] @name)
]) @assign
(variable_declarator name: [
  (identifier) @name
  (array_pattern (identifier) @name)
  (object_pattern [
    (shorthand_property_identifier_pattern) @name
    (pair_pattern value: (identifier) @name)
  ])
] value: (_)) @assign

; -- imports: one match per imported name ---------------------------------------------------
; `import x from 'm'`: the default export, looked up under its local name.
(import_statement
  (import_clause (identifier) @name)
  source: (string (string_fragment) @module)) @import
; `import { a, b as c } from 'm'` (also TypeScript's `import type { ... }`).
(import_statement
  (import_clause (named_imports (import_specifier name: (_) @name alias: (_)? @alias)))
  source: (string (string_fragment) @module)) @import
; `import * as ns from 'm'`: every name of the module, so `ns.f()` resolves to it.
(import_statement
  (import_clause (namespace_import "*" @name (identifier) @alias))
  source: (string (string_fragment) @module)) @import
; `import 'm'` for its side effects.
(import_statement . source: (string (string_fragment) @module)) @import
; CommonJS: `const m = require('m')` (the module itself, like Python's `import m as m`) and
; `const { a, b: c } = require('m')`.
(_ (variable_declarator
  name: (identifier) @alias
  value: (call_expression
    function: (identifier) @_require
    arguments: (arguments . (string (string_fragment) @module) .)))
  (#eq? @_require "require")) @import
(_ (variable_declarator
  name: (object_pattern [
    (shorthand_property_identifier_pattern) @name
    (pair_pattern key: (property_identifier) @name value: (identifier) @alias)
  ])
  value: (call_expression
    function: (identifier) @_require
    arguments: (arguments . (string (string_fragment) @module) .)))
  (#eq? @_require "require")) @import
