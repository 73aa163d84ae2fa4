; codekv anchors for TypeScript: its own definitions, heritage clauses, types and class
; fields (other nodes than JavaScript's), then ecmascript.scm (shared with JavaScript); TSX adds
; jsx.scm. Capture names: see codekv/grammars/__init__.py.

; -- definitions ----------------------------------------------------------------------------
(function_declaration name: (identifier) @name) @definition.function
(generator_function_declaration name: (identifier) @name) @definition.function
(function_signature name: (identifier) @name) @definition.function
(class_declaration name: (type_identifier) @name) @definition.class
(abstract_class_declaration name: (type_identifier) @name) @definition.class
(method_definition
  name: [(property_identifier) (private_property_identifier)] @name) @definition.method
(method_signature name: (property_identifier) @name) @definition.method
(abstract_method_signature name: (property_identifier) @name) @definition.method
; `handler = () => ...` inside a class body.
(public_field_definition
  name: [(property_identifier) (private_property_identifier)] @name
  value: [(arrow_function) (function_expression) (generator_function)]) @definition.method
(interface_declaration name: (type_identifier) @name) @definition.interface
(type_alias_declaration name: (type_identifier) @name) @definition.type
(enum_declaration name: (identifier) @name) @definition.enum
(internal_module name: [(identifier) (nested_identifier)] @name) @definition.module
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
    (new_expression) (await_expression) (as_expression) (satisfies_expression)
    (non_null_expression)
    (call_expression function: (_) @_callee (#not-eq? @_callee "require"))
  ]) @definition.constant))
(program (export_statement (_ (variable_declarator
  name: (identifier) @name
  value: [
    (number) (string) (template_string) (regex) (true) (false) (null) (undefined)
    (object) (array) (identifier) (member_expression) (subscript_expression)
    (binary_expression) (unary_expression) (ternary_expression) (parenthesized_expression)
    (new_expression) (await_expression) (as_expression) (satisfies_expression)
    (non_null_expression)
    (call_expression function: (_) @_callee (#not-eq? @_callee "require"))
  ]) @definition.constant)))

; -- references: base classes and types ----------------------------------------------------
(extends_clause value: [
  (identifier) @name
  (member_expression property: (property_identifier) @name)
]) @reference.inherit
(implements_clause [
  (type_identifier) @name
  (generic_type name: (type_identifier) @name)
  (nested_type_identifier name: (type_identifier) @name)
  (generic_type name: (nested_type_identifier name: (type_identifier) @name))
]) @reference.inherit
(extends_type_clause type: [
  (type_identifier) @name
  (generic_type name: (type_identifier) @name)
  (nested_type_identifier name: (type_identifier) @name)
  (generic_type name: (nested_type_identifier name: (type_identifier) @name))
]) @reference.inherit
; Types: a type identifier wherever it is used rather than declared (declared: the names of
; classes, interfaces, aliases and type parameters; `infer U` declares U too).
(generic_type name: (type_identifier) @name @reference.type)
(nested_type_identifier name: (type_identifier) @name @reference.type)
(type_alias_declaration value: (type_identifier) @name @reference.type)
(type_predicate type: (type_identifier) @name @reference.type)
(mapped_type_clause type: (type_identifier) @name @reference.type)
[
  (type_annotation (type_identifier) @name @reference.type)
  (opting_type_annotation (type_identifier) @name @reference.type)
  (omitting_type_annotation (type_identifier) @name @reference.type)
  (adding_type_annotation (type_identifier) @name @reference.type)
  (type_arguments (type_identifier) @name @reference.type)
  (array_type (type_identifier) @name @reference.type)
  (tuple_type (type_identifier) @name @reference.type)
  (optional_type (type_identifier) @name @reference.type)
  (rest_type (type_identifier) @name @reference.type)
  (readonly_type (type_identifier) @name @reference.type)
  (parenthesized_type (type_identifier) @name @reference.type)
  (union_type (type_identifier) @name @reference.type)
  (intersection_type (type_identifier) @name @reference.type)
  (conditional_type (type_identifier) @name @reference.type)
  (function_type (type_identifier) @name @reference.type)
  (constructor_type (type_identifier) @name @reference.type)
  (lookup_type (type_identifier) @name @reference.type)
  (index_type_query (type_identifier) @name @reference.type)
  (template_type (type_identifier) @name @reference.type)
  (constraint (type_identifier) @name @reference.type)
  (default_type (type_identifier) @name @reference.type)
  (as_expression (type_identifier) @name @reference.type)
  (satisfies_expression (type_identifier) @name @reference.type)
]

; -- assignments ----------------------------------------------------------------------------
; A class field with an initial value: `size = 3`.
(public_field_definition
  name: [(property_identifier) (private_property_identifier)] @name
  value: (_)) @assign

; -- imports ----------------------------------------------------------------------------
; `import m = require('m')`: the module itself.
(import_statement
  (import_require_clause (identifier) @alias source: (string (string_fragment) @module))) @import
