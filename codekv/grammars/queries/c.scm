; codekv anchors for C. Capture names: see codekv/grammars/__init__.py.

; -- definitions: functions, structs/unions/enums, typedefs, macros -------------------------
; A function definition's name sits inside its declarator (`int **f(void)`); prototypes are
; not definitions, so a call resolves to the implementation.
(function_definition declarator: [
  (function_declarator declarator: (identifier) @name)
  (pointer_declarator declarator: (function_declarator declarator: (identifier) @name))
  (pointer_declarator declarator: (pointer_declarator
    declarator: (function_declarator declarator: (identifier) @name)))
]) @definition.function

(struct_specifier name: (type_identifier) @name body: (_)) @definition.struct
(union_specifier name: (type_identifier) @name body: (_)) @definition.union
(enum_specifier name: (type_identifier) @name body: (_)) @definition.enum
(enumerator name: (identifier) @name) @definition.constant
(type_definition declarator: [
  (type_identifier) @name
  (pointer_declarator declarator: (type_identifier) @name)
  (array_declarator declarator: (type_identifier) @name)
  (function_declarator declarator: (parenthesized_declarator
    (pointer_declarator declarator: (type_identifier) @name)))
]) @definition.type
(preproc_def name: (identifier) @name) @definition.macro
(preproc_function_def name: (identifier) @name) @definition.macro

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

; -- includes: `#include "x.h"` -> module x.h; `<stdio.h>` keeps its brackets ---------------
(preproc_include path: (string_literal (string_content) @module)) @import
(preproc_include path: (system_lib_string) @module) @import
