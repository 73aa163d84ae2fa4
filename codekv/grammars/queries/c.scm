; codekv anchors for C, then c_family.scm (shared with C++). Capture names: see
; codekv/grammars/__init__.py.

; -- definitions: functions (structs, typedefs and macros: c_family.scm) --------------------
; A function definition's name sits inside its declarator (`int **f(void)`); prototypes are
; not definitions, so a call resolves to the implementation.
(function_definition declarator: [
  (function_declarator declarator: (identifier) @name)
  (pointer_declarator declarator: (function_declarator declarator: (identifier) @name))
  (pointer_declarator declarator: (pointer_declarator
    declarator: (function_declarator declarator: (identifier) @name)))
]) @definition.function

; -- calls: `f(x)`, `ops->run(x)`, `s.f(x)`; a function-like macro too ----------------------
(call_expression function: [
  (identifier) @name
  (field_expression field: (field_identifier) @name)
]) @call

; -- types: where a declaration, parameter, field, cast or sizeof names one -----------------
(declaration type: [
  (type_identifier) @name
  (struct_specifier name: (type_identifier) @name !body)
  (union_specifier name: (type_identifier) @name !body)
  (enum_specifier name: (type_identifier) @name !body)
]) @reference.type
(field_declaration type: [
  (type_identifier) @name
  (struct_specifier name: (type_identifier) @name !body)
  (union_specifier name: (type_identifier) @name !body)
  (enum_specifier name: (type_identifier) @name !body)
]) @reference.type
(parameter_declaration type: [
  (type_identifier) @name
  (struct_specifier name: (type_identifier) @name !body)
  (union_specifier name: (type_identifier) @name !body)
  (enum_specifier name: (type_identifier) @name !body)
]) @reference.type
(function_definition type: [
  (type_identifier) @name
  (struct_specifier name: (type_identifier) @name !body)
  (union_specifier name: (type_identifier) @name !body)
  (enum_specifier name: (type_identifier) @name !body)
]) @reference.type
(type_descriptor type: [
  (type_identifier) @name
  (struct_specifier name: (type_identifier) @name !body)
  (union_specifier name: (type_identifier) @name !body)
  (enum_specifier name: (type_identifier) @name !body)
]) @reference.type
(type_definition type: [
  (type_identifier) @name
  (struct_specifier name: (type_identifier) @name !body)
  (union_specifier name: (type_identifier) @name !body)
  (enum_specifier name: (type_identifier) @name !body)
]) @reference.type

; -- control flow ---------------------------------------------------------------------------
[
  (if_statement)
  (else_clause)
  (for_statement)
  (while_statement)
  (do_statement)
  (switch_statement)
  (case_statement)
  (conditional_expression)
] @branch

(return_statement) @return

; -- assignments: `x = ...`, `p->f += ...`, `*p = ...`, `a[i] = ...`, `int x = ...` ----------
(assignment_expression left: [
  (identifier) @name
  (field_expression field: (field_identifier) @name)
  (pointer_expression argument: (identifier) @name)
  (subscript_expression argument: (identifier) @name)
]) @assign
(init_declarator declarator: [
  (identifier) @name
  (pointer_declarator declarator: (identifier) @name)
  (pointer_declarator declarator: (pointer_declarator declarator: (identifier) @name))
  (array_declarator declarator: (identifier) @name)
]) @assign

