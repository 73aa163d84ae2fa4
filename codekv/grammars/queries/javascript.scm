; codekv anchors for JavaScript (and JSX). Capture names: see codekv/grammars/__init__.py.

; -- definitions ----------------------------------------------------------------------------
(function_declaration name: (identifier) @name) @definition.function
(generator_function_declaration name: (identifier) @name) @definition.function
(class_declaration name: (identifier) @name) @definition.class
(method_definition
  name: [(property_identifier) (private_property_identifier)] @name) @definition.method
; `handler = () => ...` inside a class body.
(field_definition
  property: [(property_identifier) (private_property_identifier)] @name
  value: [(arrow_function) (function_expression) (generator_function)]) @definition.method
; `const f = () => ...`, `const f = function () {}`, `const A = class {}`.
(variable_declarator
  name: (identifier) @name
  value: [(arrow_function) (function_expression) (generator_function)]) @definition.function
(variable_declarator name: (identifier) @name value: (class)) @definition.class
; CommonJS: `exports.f = function () {}`, `Foo.prototype.f = () => ...`.
(assignment_expression
  left: (member_expression property: (property_identifier) @name)
  right: [(arrow_function) (function_expression) (generator_function)]) @definition.function
; Module-level bindings to anything but a function, a class or a require() call.
(program (_ (variable_declarator
  name: (identifier) @name
  value: [
    (number) (string) (template_string) (regex) (true) (false) (null) (undefined)
    (object) (array) (identifier) (member_expression) (subscript_expression)
    (binary_expression) (unary_expression) (ternary_expression) (parenthesized_expression)
    (new_expression) (await_expression) (jsx_element) (jsx_self_closing_element)
    (call_expression function: (_) @_callee (#not-eq? @_callee "require"))
  ]) @definition.constant))
(program (export_statement (_ (variable_declarator
  name: (identifier) @name
  value: [
    (number) (string) (template_string) (regex) (true) (false) (null) (undefined)
    (object) (array) (identifier) (member_expression) (subscript_expression)
    (binary_expression) (unary_expression) (ternary_expression) (parenthesized_expression)
    (new_expression) (await_expression) (jsx_element) (jsx_self_closing_element)
    (call_expression function: (_) @_callee (#not-eq? @_callee "require"))
  ]) @definition.constant)))

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
; A JSX element renders (calls) its component; lower-case tags are HTML, not references.
([
  (jsx_opening_element name: (identifier) @name)
  (jsx_self_closing_element name: (identifier) @name)
] @call (#match? @name "^[A-Z]"))
[
  (jsx_opening_element name: (member_expression property: (property_identifier) @name))
  (jsx_self_closing_element name: (member_expression property: (property_identifier) @name))
] @call

(class_heritage [
  (identifier) @name
  (member_expression property: (property_identifier) @name)
]) @reference.inherit
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

; A class field with an initial value: `size = 3`.
(field_definition
  property: [(property_identifier) (private_property_identifier)] @name
  value: (_)) @assign

; -- imports: one match per imported name ---------------------------------------------------
; `import x from 'm'`: the default export, looked up under its local name.
(import_statement
  (import_clause (identifier) @name)
  source: (string (string_fragment) @module)) @import
; `import { a, b as c } from 'm'`.
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
