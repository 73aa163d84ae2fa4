; codekv anchors for Go. Capture names: see codekv/grammars/__init__.py.

(function_declaration name: (identifier) @name) @definition.function
(method_declaration name: (field_identifier) @name) @definition.method
; A method an interface declares defines its name, as a Java interface method does.
(method_elem name: (field_identifier) @name) @definition.method
(type_spec name: (type_identifier) @name type: (struct_type)) @definition.class
(type_spec name: (type_identifier) @name type: (interface_type)) @definition.interface
(type_spec name: (type_identifier) @name type: [
  (type_identifier)
  (qualified_type)
  (generic_type)
  (pointer_type)
  (slice_type)
  (array_type)
  (map_type)
  (channel_type)
  (function_type)
]) @definition.type
(type_alias name: (type_identifier) @name) @definition.type
(source_file (const_declaration (const_spec (identifier) @name) @definition.constant))
(source_file (var_declaration (var_spec (identifier) @name) @definition.variable))
(source_file (var_declaration (var_spec_list (var_spec (identifier) @name) @definition.variable)))

(call_expression
  function: [
    (identifier) @name
    (selector_expression field: (field_identifier) @name)
    (parenthesized_expression (identifier) @name)
    (parenthesized_expression (selector_expression field: (field_identifier) @name))
    (index_expression operand: (identifier) @name)
    (index_expression operand: (selector_expression field: (field_identifier) @name))
  ]) @call

; Every type name outside a type's own declaration is a use of it (the declaration's name
; resolves to its own chunk, which the graph skips).
(type_identifier) @name @reference.type

[
  (if_statement)
  (for_statement)
  (expression_switch_statement)
  (type_switch_statement)
  (select_statement)
  (expression_case)
  (type_case)
  (default_case)
  (communication_case)
] @branch
(if_statement alternative: (block) @branch)

(return_statement) @return

(short_var_declaration left: (expression_list (identifier) @name) (#not-eq? @name "_")) @assign
(assignment_statement left: (expression_list [
  (identifier) @name
  (selector_expression field: (field_identifier) @name)
]) (#not-eq? @name "_")) @assign
(var_spec (identifier) @name (#not-eq? @name "_")) @assign
(receive_statement left: (expression_list (identifier) @name) (#not-eq? @name "_")) @assign
(inc_statement [
  (identifier) @name
  (selector_expression field: (field_identifier) @name)
]) @assign
(dec_statement [
  (identifier) @name
  (selector_expression field: (field_identifier) @name)
]) @assign

; One import per spec: the package path without quotes, and its local name when given
; (`str "strings"`, `. "net/http"` and `_ "embed"` alike).
(import_spec
  name: (_)? @alias
  path: (interpreted_string_literal (interpreted_string_literal_content) @module)) @import
