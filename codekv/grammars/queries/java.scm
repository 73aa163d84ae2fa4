; codekv anchors for Java. Capture names: see codekv/grammars/__init__.py.

; -- definitions ---------------------------------------------------------------------------
(class_declaration name: (identifier) @name) @definition.class
(interface_declaration name: (identifier) @name) @definition.interface
(enum_declaration name: (identifier) @name) @definition.enum
(record_declaration name: (identifier) @name) @definition.record
(annotation_type_declaration name: (identifier) @name) @definition.annotation
(method_declaration name: (identifier) @name) @definition.method
(annotation_type_element_declaration name: (identifier) @name) @definition.method
(field_declaration declarator: (variable_declarator name: (identifier) @name)) @definition.field
(constant_declaration
  declarator: (variable_declarator name: (identifier) @name)) @definition.constant
(enum_constant name: (identifier) @name) @definition.constant

; A constructor is named after its class. As a definition of that name it would make every
; use of a split class ambiguous between the class and its constructors, so it is a reference
; to the class instead: the constructor depends on the class header (its fields).
(constructor_declaration name: (identifier) @name) @reference.constructor
(compact_constructor_declaration name: (identifier) @name) @reference.constructor

; -- calls: `a.b(x)` calls b; `new Foo<T>(x)` calls Foo --------------------------------------
(method_invocation name: (identifier) @name) @call
(object_creation_expression type: [
  (type_identifier) @name  (generic_type (type_identifier) @name)
  (scoped_type_identifier (type_identifier) @name .)
  (generic_type (scoped_type_identifier (type_identifier) @name .))
]) @call
; `Foo::bar`, `this::bar` refer to bar; `Foo::new` to Foo.
(method_reference (identifier) @name .) @reference.method
; A capitalised receiver is a class (or a constant): `Util.max(x)`, `Color.RED`.
(method_invocation object: (identifier) @name (#match? @name "^[A-Z]")) @reference.type
(field_access object: (identifier) @name (#match? @name "^[A-Z]")) @reference.type

; -- references: supertypes, annotations, types ---------------------------------------------
(superclass [
  (type_identifier) @name  (generic_type (type_identifier) @name)
  (scoped_type_identifier (type_identifier) @name .)
  (generic_type (scoped_type_identifier (type_identifier) @name .))
]) @reference.inherit
(super_interfaces (type_list [
  (type_identifier) @name  (generic_type (type_identifier) @name)
  (scoped_type_identifier (type_identifier) @name .)
  (generic_type (scoped_type_identifier (type_identifier) @name .))
])) @reference.inherit
(extends_interfaces (type_list [
  (type_identifier) @name  (generic_type (type_identifier) @name)
  (scoped_type_identifier (type_identifier) @name .)
  (generic_type (scoped_type_identifier (type_identifier) @name .))
])) @reference.inherit
(marker_annotation name: [
  (identifier) @name
  (scoped_identifier name: (identifier) @name)
]) @reference.annotation
(annotation name: [
  (identifier) @name
  (scoped_identifier name: (identifier) @name)
]) @reference.annotation

; Types where a declaration, parameter, cast, throws clause or type argument names them
; (`new Foo()` is a call, not also a type reference).
(local_variable_declaration type: [
  (type_identifier) @name  (generic_type (type_identifier) @name)
  (scoped_type_identifier (type_identifier) @name .)  (array_type element: (type_identifier) @name)
]) @reference.type
(field_declaration type: [
  (type_identifier) @name  (generic_type (type_identifier) @name)
  (scoped_type_identifier (type_identifier) @name .)  (array_type element: (type_identifier) @name)
]) @reference.type
(constant_declaration type: [
  (type_identifier) @name  (generic_type (type_identifier) @name)
  (scoped_type_identifier (type_identifier) @name .)  (array_type element: (type_identifier) @name)
]) @reference.type
(formal_parameter type: [
  (type_identifier) @name  (generic_type (type_identifier) @name)
  (scoped_type_identifier (type_identifier) @name .)  (array_type element: (type_identifier) @name)
]) @reference.type
(spread_parameter [
  (type_identifier) @name  (generic_type (type_identifier) @name)
  (scoped_type_identifier (type_identifier) @name .)  (array_type element: (type_identifier) @name)
]) @reference.type
(method_declaration type: [
  (type_identifier) @name  (generic_type (type_identifier) @name)
  (scoped_type_identifier (type_identifier) @name .)  (array_type element: (type_identifier) @name)
]) @reference.type
(annotation_type_element_declaration type: [
  (type_identifier) @name  (generic_type (type_identifier) @name)
  (scoped_type_identifier (type_identifier) @name .)  (array_type element: (type_identifier) @name)
]) @reference.type
(enhanced_for_statement type: [
  (type_identifier) @name  (generic_type (type_identifier) @name)
  (scoped_type_identifier (type_identifier) @name .)  (array_type element: (type_identifier) @name)
]) @reference.type
(cast_expression type: [
  (type_identifier) @name  (generic_type (type_identifier) @name)
  (scoped_type_identifier (type_identifier) @name .)  (array_type element: (type_identifier) @name)
]) @reference.type
(instanceof_expression right: [
  (type_identifier) @name  (generic_type (type_identifier) @name)
  (scoped_type_identifier (type_identifier) @name .)  (array_type element: (type_identifier) @name)
]) @reference.type
(array_creation_expression type: [
  (type_identifier) @name  (generic_type (type_identifier) @name)
  (scoped_type_identifier (type_identifier) @name .)  (array_type element: (type_identifier) @name)
]) @reference.type
(resource type: [
  (type_identifier) @name  (generic_type (type_identifier) @name)
  (scoped_type_identifier (type_identifier) @name .)  (array_type element: (type_identifier) @name)
]) @reference.type
(catch_type [
  (type_identifier) @name  (generic_type (type_identifier) @name)
  (scoped_type_identifier (type_identifier) @name .)  (array_type element: (type_identifier) @name)
]) @reference.type
(throws [
  (type_identifier) @name  (generic_type (type_identifier) @name)
  (scoped_type_identifier (type_identifier) @name .)  (array_type element: (type_identifier) @name)
]) @reference.type
(type_arguments [
  (type_identifier) @name  (generic_type (type_identifier) @name)
  (scoped_type_identifier (type_identifier) @name .)  (array_type element: (type_identifier) @name)
]) @reference.type
(wildcard [
  (type_identifier) @name  (generic_type (type_identifier) @name)
  (scoped_type_identifier (type_identifier) @name .)  (array_type element: (type_identifier) @name)
]) @reference.type
(type_bound [
  (type_identifier) @name  (generic_type (type_identifier) @name)
  (scoped_type_identifier (type_identifier) @name .)  (array_type element: (type_identifier) @name)
]) @reference.type
(class_literal [
  (type_identifier) @name  (generic_type (type_identifier) @name)
  (scoped_type_identifier (type_identifier) @name .)  (array_type element: (type_identifier) @name)
]) @reference.type

; -- control flow ---------------------------------------------------------------------------
[
  (if_statement)
  (for_statement)
  (enhanced_for_statement)
  (while_statement)
  (do_statement)
  (try_statement)
  (try_with_resources_statement)
  (catch_clause)
  (finally_clause)
  (switch_expression)
  (switch_block_statement_group)
  (switch_rule)
  (ternary_expression)
] @branch
; `else { ... }` (an `else if` is the nested if_statement itself).
(if_statement alternative: (block) @branch)

[
  (return_statement)
  (throw_statement)
  (yield_statement)
] @return

; -- assignments ----------------------------------------------------------------------------
(assignment_expression left: [
  (identifier) @name
  (field_access field: (identifier) @name)
  (array_access array: [
    (identifier) @name
    (field_access field: (identifier) @name)
  ])
]) @assign
(local_variable_declaration
  declarator: (variable_declarator name: (identifier) @name value: (_))) @assign

; -- imports: `import a.b.C;` -> module a.b, name C; `import a.b.*;` -> name * ---------------
(import_declaration (scoped_identifier scope: (_) @module name: (identifier) @name) .) @import
(import_declaration (scoped_identifier) @module (asterisk) @name) @import
