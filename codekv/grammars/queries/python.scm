; codekv anchors for Python. Capture names: see codekv/grammars/__init__.py.

(function_definition name: (identifier) @name) @definition.function
(class_definition name: (identifier) @name) @definition.class
(module (expression_statement (assignment left: (identifier) @name) @definition.constant))

(call
  function: [
    (identifier) @name
    (attribute attribute: (identifier) @name)
  ]) @call

(class_definition superclasses: (argument_list [
  (identifier) @name
  (attribute attribute: (identifier) @name)
]) @reference.inherit)
(decorator [
  (identifier) @name
  (attribute attribute: (identifier) @name)
]) @reference.decorator
(type [
  (identifier) @name
  (attribute attribute: (identifier) @name)
  (generic_type (identifier) @name)
]) @reference.type

[
  (if_statement)
  (elif_clause)
  (else_clause)
  (for_statement)
  (while_statement)
  (try_statement)
  (except_clause)
  (finally_clause)
  (with_statement)
  (match_statement)
  (case_clause)
  (conditional_expression)
] @branch

[
  (return_statement)
  (yield)
  (raise_statement)
] @return

(assignment left: [
  (identifier) @name
  (attribute attribute: (identifier) @name)
  (pattern_list (identifier) @name)
  (tuple_pattern (identifier) @name)
]) @assign
(augmented_assignment left: [
  (identifier) @name
  (attribute attribute: (identifier) @name)
]) @assign

(import_statement name: [
  (dotted_name) @module
  (aliased_import name: (_) @module alias: (_) @alias)
]) @import
(import_from_statement module_name: (_) @module name: [
  (dotted_name) @name
  (aliased_import name: (_) @name alias: (_) @alias)
]) @import
(import_from_statement module_name: (_) @module (wildcard_import) @name) @import
