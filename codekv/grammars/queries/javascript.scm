; codekv anchors for JavaScript (and JSX): its own definitions and class nodes, then
; ecmascript.scm (shared with TypeScript) and jsx.scm. Capture names: see
; codekv/grammars/__init__.py.

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

; -- references: base classes --------------------------------------------------------------
(class_heritage [
  (identifier) @name
  (member_expression property: (property_identifier) @name)
]) @reference.inherit

; -- assignments ----------------------------------------------------------------------------
; A class field with an initial value: `size = 3`.
(field_definition
  property: [(property_identifier) (private_property_identifier)] @name
  value: (_)) @assign
