; codekv anchors for JSX, compiled after javascript.scm or (TSX) typescript.scm with
; ecmascript.scm: the JSX patterns, which the plain TypeScript grammar has no nodes for.

; A JSX element renders (calls) its component; lower-case tags are HTML, not references.
([
  (jsx_opening_element name: (identifier) @name)
  (jsx_self_closing_element name: (identifier) @name)
] @call (#match? @name "^[A-Z]"))
[
  (jsx_opening_element name: (member_expression property: (property_identifier) @name))
  (jsx_self_closing_element name: (member_expression property: (property_identifier) @name))
] @call
