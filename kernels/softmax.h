// Placeholder: filled in by its op family.
#pragma once
