; codekv anchors for Rust. Capture names: see codekv/grammars/__init__.py.

; Definitions. An impl block defines no name of its own (its type is referenced instead):
; defining the type's name twice would make every use of the type ambiguous.
(source_file (function_item name: (identifier) @name) @definition.function)
(block (function_item name: (identifier) @name) @definition.function)
(mod_item body: (declaration_list (function_item name: (identifier) @name) @definition.function))
(impl_item body: (declaration_list (function_item name: (identifier) @name) @definition.method))
(trait_item body: (declaration_list (function_item name: (identifier) @name) @definition.method))
; A method a trait declares without a body defines its name too, as a Java interface method
; does (a signature in an `extern` block is a prototype, not a definition).
(trait_item body: (declaration_list
  (function_signature_item name: (identifier) @name) @definition.method))
(struct_item name: (type_identifier) @name) @definition.class
(enum_item name: (type_identifier) @name) @definition.class
(union_item name: (type_identifier) @name) @definition.class
(trait_item name: (type_identifier) @name) @definition.interface
(type_item name: (type_identifier) @name) @definition.type
(mod_item name: (identifier) @name) @definition.module
(const_item name: (identifier) @name) @definition.constant
(static_item name: (identifier) @name) @definition.constant
(macro_definition name: (identifier) @name) @definition.macro

; Calls: a function, a path's last name (`Vec::new`), a method, a turbofish, a macro.
(call_expression
  function: [
    (identifier) @name
    (scoped_identifier name: (identifier) @name)
    (field_expression field: (field_identifier) @name)
    (generic_function function: [
      (identifier) @name
      (scoped_identifier name: (identifier) @name)
      (field_expression field: (field_identifier) @name)
    ])
  ]) @call
(macro_invocation macro: [
  (identifier) @name
  (scoped_identifier name: (identifier) @name)
]) @call

; Types, by the positions a type name can take (a type's own name and a type parameter's
; are left out); trait bounds and implemented traits get kinds of their own.
(_ type: (type_identifier) @name) @reference.type
(_ return_type: (type_identifier) @name) @reference.type
(_ element: (type_identifier) @name) @reference.type
(type_arguments (type_identifier) @name) @reference.type
(tuple_type (type_identifier) @name) @reference.type
(scoped_type_identifier name: (type_identifier) @name) @reference.type
(struct_expression name: (type_identifier) @name) @reference.type
(where_predicate left: (type_identifier) @name) @reference.type
(trait_bounds (type_identifier) @name) @reference.bound
(abstract_type trait: (type_identifier) @name) @reference.bound
(dynamic_type trait: (type_identifier) @name) @reference.bound
(impl_item trait: (type_identifier) @name) @reference.implementation
; `Kind::A`, `shapes::area`: the path's head names an enum, type or module.
(scoped_identifier path: (identifier) @name) @reference.path

[
  (if_expression)
  (else_clause)
  (match_expression)
  (match_arm)
  (loop_expression)
  (while_expression)
  (for_expression)
] @branch

[
  (return_expression)
  (try_expression)
] @return

(let_declaration pattern: [
  (identifier) @name
  (mut_pattern (identifier) @name)
  (ref_pattern (identifier) @name)
  (tuple_pattern (identifier) @name)
  (tuple_pattern (mut_pattern (identifier) @name))
  (tuple_struct_pattern (identifier) @name)
  (struct_pattern (field_pattern name: (shorthand_field_identifier) @name))
  (struct_pattern (field_pattern pattern: (identifier) @name))
]) @assign
(assignment_expression left: [
  (identifier) @name
  (field_expression field: (field_identifier) @name)
]) @assign
(compound_assignment_expr left: [
  (identifier) @name
  (field_expression field: (field_identifier) @name)
]) @assign

; Imports: one match per imported name. @module is the path before the name; in a use tree
; the path is split over several @module captures (`a::{b::c}`), which join in source order.
(use_declaration argument: (identifier) @module) @import
(use_declaration argument: (scoped_identifier
  path: (_) @module name: (identifier) @name)) @import
(use_declaration argument: (use_as_clause
  path: (identifier) @module alias: (identifier) @alias)) @import
(use_declaration argument: (use_as_clause
  path: (scoped_identifier path: (_) @module name: (identifier) @name)
  alias: (identifier) @alias)) @import
(use_declaration argument: (use_wildcard (_) @module "*" @name)) @import

(use_declaration argument: (scoped_use_list path: (_) @module list: (use_list [
  (identifier) @name
  (scoped_identifier path: (_) @module name: (identifier) @name)
  (use_as_clause path: (identifier) @name alias: (identifier) @alias)
  (use_as_clause
    path: (scoped_identifier path: (_) @module name: (identifier) @name)
    alias: (identifier) @alias)
  (use_wildcard (_) @module "*" @name)
]))) @import

(use_declaration argument: (scoped_use_list path: (_) @module list: (use_list
  (scoped_use_list path: (_) @module list: (use_list [
    (identifier) @name
    (scoped_identifier path: (_) @module name: (identifier) @name)
    (use_as_clause path: (identifier) @name alias: (identifier) @alias)
    (use_as_clause
      path: (scoped_identifier path: (_) @module name: (identifier) @name)
      alias: (identifier) @alias)
    (use_wildcard (_) @module "*" @name)
  ]))))) @import
